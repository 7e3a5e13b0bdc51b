//! ETH that moves inside a transaction: a smart-contract wallet (Safe, an ERC-4337 account)
//! or an exchange's batch withdrawal pays a watched address in an internal call, so the
//! transaction's own `to` and `value` say nothing of it.
//!
//! The scanner finds such money in two steps, so that a quiet round costs no trace:
//!
//! 1. **Balances.** The watched addresses' balances, read at the block before the range and at
//!    its last block in one `eth_call` per [`ADDRESSES_PER_BALANCE_CALL`] addresses (see
//!    [`BALANCE_READER`]), must differ by exactly what the range's transactions explain. An
//!    address whose balance moved otherwise is narrowed down to its blocks by reading balances
//!    in between.
//! 2. **Traces.** Those blocks are traced (`debug_traceBlockByHash` with geth's `callTracer`,
//!    or Parity's `trace_block`, as the node offers), and every value-moving frame that
//!    succeeded, under parents that all succeeded, in a transaction that succeeded, becomes a
//!    receipt (or an outflow) at [`TransferId::internal_position`] of its ordinal.
//!
//! [`TransferId::internal_position`]: payrecon_chain_core::TransferId::internal_position

use std::collections::{BTreeMap, HashMap};
use std::ops::RangeInclusive;

use alloy::primitives::{Address, B256, Bytes, U256};
use alloy::providers::{Provider, RootProvider};
use alloy::rpc::types::trace::common::TraceResult;
use alloy::rpc::types::trace::geth::{
    CallFrame, GethDebugBuiltInTracerType, GethDebugTracerType, GethDebugTracingOptions,
};
use alloy::rpc::types::trace::parity::{Action, CallType, LocalizedTransactionTrace, TraceOutput};
use alloy::rpc::types::{Block, TransactionRequest};
use alloy::transports::RpcError;
use futures_util::{StreamExt as _, TryStreamExt as _};
use payrecon_chain_core::blocks::BlockRange;
use payrecon_chain_core::{
    Amount, BlockId, KeyIndex, Method, Network, Outflow, ReceivedAsset, ScanError, Transfer,
    TransferId, Unexplained, WatchView, excerpt,
};

use crate::watch::{base_units, classify};

/// Creation code whose constructor returns, as the "code" it would deploy, the balance of each
/// address appended to it (one 32-byte word each, the address in the low 20 bytes), in order.
/// `eth_call` runs creation code without deploying anything, so this reads any number of
/// balances at one block in one call on every node, with no contract that must exist on the
/// chain (Multicall3's `getEthBalance` needs its deployment, and trusting whatever sits at its
/// address on a chain is one more thing to trust).
///
/// ```text
/// 00 PUSH2 0x0028  CODESIZE  SUB            n = codesize - 40: the appended words' bytes
/// 05 DUP1  PUSH2 0x0028  PUSH1 0  CODECOPY  memory[0..n] = the appended words
/// 12 PUSH1 0                                i = 0
/// 14 JUMPDEST  DUP2 DUP2 LT ISZERO  PUSH2 0x0023 JUMPI      while i < n:
/// 23 DUP1 MLOAD BALANCE  DUP2 MSTORE                          memory[i] = balance(memory[i])
/// 28 PUSH1 32 ADD  PUSH2 0x000e JUMP                          i += 32
/// 35 JUMPDEST POP  PUSH1 0  RETURN                          return memory[0..n]
/// ```
pub const BALANCE_READER: [u8; 40] = [
    0x61, 0x00, 0x28, 0x38, 0x03, 0x80, 0x61, 0x00, 0x28, 0x60, 0x00, 0x39, 0x60, 0x00, 0x5b, 0x81,
    0x81, 0x10, 0x15, 0x61, 0x00, 0x23, 0x57, 0x80, 0x51, 0x31, 0x81, 0x52, 0x60, 0x20, 0x01, 0x61,
    0x00, 0x0e, 0x56, 0x5b, 0x50, 0x60, 0x00, 0xf3,
];

/// Addresses per balance call: what the constructor returns is held to the contract-size
/// limit (EIP-170, 24,576 bytes), 768 words; 500 stays well inside it and inside any node's
/// gas cap for a call (500 cold balance reads and the returned bytes: about 4.5 million gas).
pub const ADDRESSES_PER_BALANCE_CALL: usize = 500;

/// What each of `addresses` held at the block `at` (by hash, EIP-1898: the answers hold still
/// however the chain moves meanwhile).
pub async fn balances(
    provider: &RootProvider,
    addresses: &[Address],
    at: B256,
) -> Result<Vec<U256>, ScanError> {
    let chunks: Vec<Vec<Address>> = addresses
        .chunks(ADDRESSES_PER_BALANCE_CALL)
        .map(<[Address]>::to_vec)
        .collect();
    let chunks: Vec<Vec<U256>> = futures_util::stream::iter(chunks)
        .map(|chunk| {
            let provider = provider.clone();
            async move { balances_of_chunk(&provider, &chunk, at).await }
        })
        .buffered(BALANCE_CALLS_IN_FLIGHT)
        .try_collect()
        .await?;
    Ok(chunks.into_iter().flatten().collect())
}

/// Reads of a doubted balance at most, each after [`DOUBT_PAUSE`], until two agree.
const DOUBT_READS: usize = 3;

/// The pause before a doubted balance is read again.
const DOUBT_PAUSE: std::time::Duration = std::time::Duration::from_millis(200);

/// Balance calls sent at once: a round at 10,000 watched addresses asks 20.
const BALANCE_CALLS_IN_FLIGHT: usize = 8;

/// One balance call: [`BALANCE_READER`] with `chunk` appended, at `at`.
async fn balances_of_chunk(
    provider: &RootProvider,
    chunk: &[Address],
    at: B256,
) -> Result<Vec<U256>, ScanError> {
    let mut code = BALANCE_READER.to_vec();
    for address in chunk {
        code.extend_from_slice(address.into_word().as_slice());
    }
    let request = TransactionRequest::default().input(Bytes::from(code).into());
    let answer = provider
        .call(request)
        .block(alloy::eips::BlockId::hash(at))
        .await
        .map_err(classify)?;
    if answer.len() != chunk.len() * 32 {
        return Err(ScanError::Fatal(format!(
            "the balance reader answered {} bytes for {} addresses, not 32 each",
            answer.len(),
            chunk.len()
        )));
    }
    Ok(answer.chunks_exact(32).map(U256::from_be_slice).collect())
}

/// Value a contract moved inside a transaction that succeeded, in a frame that succeeded under
/// parents that all did: what reached `to` for good.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InternalMove {
    /// The transaction.
    pub tx: B256,
    /// Its value-moving internal frames counted from 0 in execution order, failed ones included.
    pub ordinal: usize,
    /// The contract that sent it.
    pub from: Address,
    /// Where it went.
    pub to: Address,
    /// How much, in wei (never zero).
    pub value: U256,
}

/// How a node traces a block, learnt from its first answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tracer {
    /// geth's `debug_traceBlockByHash` with the `callTracer` (geth, Erigon, Reth, Nethermind,
    /// Besu, anvil).
    CallTracer,
    /// Parity's `trace_block` (Erigon, Reth, Nethermind, anvil).
    ParityTrace,
}

/// The node cannot trace a block at all: neither API is served (a pruned node, a provider
/// plan without trace methods).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoTraces(pub String);

/// The internal moves of the block `hash` at `height`, with the tracer that served them: the
/// one that worked last time first, then the other.
pub async fn trace_block(
    provider: &RootProvider,
    height: u64,
    hash: B256,
    preferred: Option<Tracer>,
) -> Result<Result<(Vec<InternalMove>, Tracer), NoTraces>, ScanError> {
    let order = match preferred {
        Some(Tracer::ParityTrace) => [Tracer::ParityTrace, Tracer::CallTracer],
        _ => [Tracer::CallTracer, Tracer::ParityTrace],
    };
    let mut refusals = Vec::new();
    for tracer in order {
        let answer = match tracer {
            Tracer::CallTracer => {
                let options = GethDebugTracingOptions::default().with_tracer(
                    GethDebugTracerType::BuiltInTracer(GethDebugBuiltInTracerType::CallTracer),
                );
                provider
                    .client()
                    .request::<_, Vec<TraceResult<CallFrame, String>>>(
                        "debug_traceBlockByHash",
                        (hash, options),
                    )
                    .await
                    .map(|results| from_call_frames(&results))
            }
            // `trace_block` takes a number only: each trace names its block, which must be the
            // one the scan read.
            Tracer::ParityTrace => provider
                .client()
                .request::<_, Vec<LocalizedTransactionTrace>>(
                    "trace_block",
                    (alloy::eips::BlockNumberOrTag::Number(height),),
                )
                .await
                .map(|traces| {
                    if traces
                        .iter()
                        .any(|t| t.block_hash.is_some_and(|h| h != hash))
                    {
                        return Err(format!(
                            "the traces of block {height} name another block: the chain moved"
                        ));
                    }
                    from_parity_traces(&traces)
                }),
        };
        match answer {
            Ok(moves) => return Ok(Ok((moves.map_err(ScanError::Transient)?, tracer))),
            Err(RpcError::ErrorResp(payload)) if not_served(payload.code, &payload.message) => {
                refusals.push(format!("{tracer:?}: {}", payload.message));
            }
            Err(error) => return Err(classify(error)),
        }
    }
    Ok(Err(NoTraces(refusals.join("; "))))
}

/// A node's "no such method" (-32601), or a provider's refusal of a method its plan lacks.
fn not_served(code: i64, message: &str) -> bool {
    let message = message.to_lowercase();
    code == -32601
        || message.contains("not supported")
        || message.contains("not available")
        || message.contains("does not exist")
        || message.contains("method not found")
        || message.contains("not enabled")
}

/// The value moves in a block's `callTracer` answer (one result per transaction). A tracer
/// that failed on one transaction leaves the block unreadable.
pub fn from_call_frames(
    results: &[TraceResult<CallFrame, String>],
) -> Result<Vec<InternalMove>, String> {
    let mut moves = Vec::new();
    for (index, result) in results.iter().enumerate() {
        let (root, tx) = match result {
            TraceResult::Success { result, tx_hash } => (result, *tx_hash),
            TraceResult::Error { error, tx_hash } => {
                return Err(format!(
                    "the node could not trace transaction {} of the block ({tx_hash:?}): {}",
                    index,
                    payrecon_chain_core::excerpt(error)
                ));
            }
        };
        let tx = tx.ok_or_else(|| format!("trace {index} of the block names no transaction"))?;
        let mut ordinal = 0;
        // (frame, every frame above it succeeded); the root is the transaction itself, whose
        // value is its own top-level transfer.
        let mut stack: Vec<(&CallFrame, bool)> = root
            .calls
            .iter()
            .rev()
            .map(|call| (call, root.error.is_none()))
            .collect();
        while let Some((frame, parents_succeeded)) = stack.pop() {
            let succeeded = parents_succeeded && frame.error.is_none();
            let value = frame.value.unwrap_or_default();
            let moves_value = matches!(
                frame.typ.to_ascii_uppercase().as_str(),
                "CALL" | "CREATE" | "CREATE2" | "SELFDESTRUCT"
            );
            if moves_value && !value.is_zero() {
                if succeeded && let Some(to) = frame.to {
                    moves.push(InternalMove {
                        tx,
                        ordinal,
                        from: frame.from,
                        to,
                        value,
                    });
                }
                ordinal += 1;
            }
            stack.extend(frame.calls.iter().rev().map(|call| (call, succeeded)));
        }
    }
    Ok(moves)
}

/// The value moves in a block's Parity traces (flat, each transaction's frames in execution
/// order, `traceAddress` naming each frame's place under the transaction's root).
pub fn from_parity_traces(
    traces: &[LocalizedTransactionTrace],
) -> Result<Vec<InternalMove>, String> {
    let mut moves = Vec::new();
    let mut ordinals: HashMap<B256, usize> = HashMap::new();
    // Per transaction, the frames that failed: a frame under one of them moved nothing.
    let mut failed: HashMap<B256, Vec<&[usize]>> = HashMap::new();
    for trace in traces {
        // Block and uncle rewards (before the merge) belong to no transaction.
        let Some(tx) = trace.transaction_hash else {
            continue;
        };
        let place = trace.trace.trace_address.as_slice();
        let failures = failed.entry(tx).or_default();
        if trace.trace.error.is_some() {
            failures.push(place);
        }
        if place.is_empty() {
            continue; // the transaction itself: its own value is its top-level transfer
        }
        let succeeded = !failures.iter().any(|failed| place.starts_with(failed));
        let (from, to, value) = match &trace.trace.action {
            Action::Call(call) => match call.call_type {
                CallType::Call | CallType::AuthCall | CallType::None => {
                    (call.from, Some(call.to), call.value)
                }
                // A delegate call repeats its caller's value and a static call carries none; a
                // call code's value stays with the caller.
                CallType::DelegateCall | CallType::StaticCall | CallType::CallCode => continue,
            },
            Action::Create(create) => {
                let created = match &trace.trace.result {
                    Some(TraceOutput::Create(output)) => Some(output.address),
                    _ => None,
                };
                (create.from, created, create.value)
            }
            Action::Selfdestruct(destruct) => (
                destruct.address,
                Some(destruct.refund_address),
                destruct.balance,
            ),
            Action::Reward(_) => continue,
        };
        if value.is_zero() {
            continue;
        }
        let ordinal = ordinals.entry(tx).or_default();
        if succeeded && let Some(to) = to {
            moves.push(InternalMove {
                tx,
                ordinal: *ordinal,
                from,
                to,
                value,
            });
        }
        *ordinal += 1;
    }
    Ok(moves)
}

/// What the scan's transactions explain of each watched address's ETH, per block: what
/// reached it and what left it (value and gas).
#[derive(Default)]
pub struct NativeFlows {
    by_block: HashMap<(u64, Address), (U256, U256)>,
}

impl NativeFlows {
    /// `amount` reached the watched `key` in block `height`.
    pub fn receive(&mut self, height: u64, key: &str, amount: Amount) {
        if let Ok(address) = key.parse::<Address>() {
            let flow = self.by_block.entry((height, address)).or_default();
            flow.0 += U256::from(amount.base_units());
        }
    }

    /// `amount` and `fee` left the watched `key` in block `height`.
    pub fn send(&mut self, height: u64, key: &str, amount: Amount, fee: Amount) {
        if let Ok(address) = key.parse::<Address>() {
            let flow = self.by_block.entry((height, address)).or_default();
            flow.1 += U256::from(amount.base_units()) + U256::from(fee.base_units());
        }
    }

    /// What arrived and what left `address` in the blocks `heights`.
    fn explained(&self, address: Address, heights: RangeInclusive<u64>) -> (U256, U256) {
        heights.fold((U256::ZERO, U256::ZERO), |(arrived, left), height| {
            let (a, l) = self
                .by_block
                .get(&(height, address))
                .copied()
                .unwrap_or_default();
            (arrived + a, left + l)
        })
    }
}

/// What one scan attributes internal moves with: the watched addresses, what the blocks' own
/// transactions explain, and whether outflows are followed.
pub struct Found<'a> {
    /// The watched addresses.
    pub watched: &'a KeyIndex<Address>,
    /// What the scanned blocks' own transactions explain.
    pub flows: &'a NativeFlows,
    /// Whether internal moves out of watched addresses are reported as outflows.
    pub track_outflows: bool,
}

impl Found<'_> {
    /// Adds each move to or from a watched address to `range` as a receipt or an outflow of
    /// `height`; returns what moved in and out of each watched address.
    fn push_moves(
        &self,
        moves: Vec<InternalMove>,
        height: u64,
        range: &mut BlockRange,
    ) -> Result<HashMap<Address, (U256, U256)>, ScanError> {
        let eth = ReceivedAsset::Method {
            method: Method::Eth,
        };
        let mut inside: HashMap<Address, (U256, U256)> = HashMap::new();
        for found in moves {
            let position = TransferId::internal_position(found.ordinal).ok_or_else(|| {
                ScanError::Fatal(format!("{} has too many internal calls", found.tx))
            })?;
            let id = TransferId {
                network: Network::Ethereum,
                txid: found.tx.to_string(),
                position,
            };
            let amount = base_units(found.value, "internal ETH value")?;
            if let Some(key) = self.watched.get(&found.to) {
                inside.entry(found.to).or_default().0 += found.value;
                let transfer = Transfer {
                    id: id.clone(),
                    to_address: key.to_string(),
                    asset: eth.clone(),
                    amount,
                    from_address: Some(found.from.to_checksum(None)),
                };
                range.push_transfer(transfer, height)?;
            }
            if let Some(key) = self.watched.get(&found.from) {
                inside.entry(found.from).or_default().1 += found.value;
                if self.track_outflows {
                    let outflow = Outflow {
                        id,
                        spends: None,
                        from_address: key.to_string(),
                        asset: eth.clone(),
                        amount,
                        fee: Amount::ZERO,
                        to_address: Some(found.to.to_checksum(None)),
                    };
                    range.push_outflow(outflow, height)?;
                }
            }
        }
        Ok(inside)
    }

    /// The balance change of `span` in `block` beyond what `explained` (in, out) accounts for.
    fn unexplained(
        &self,
        (address, before, after): Span,
        (arrived, left): (U256, U256),
        block: &BlockId,
        reason: &str,
    ) -> Result<Unexplained, ScanError> {
        let (gained, kept) = (before + arrived, after + left);
        let (came, amount) = if kept > gained {
            (true, kept - gained)
        } else {
            (false, gained - kept)
        };
        Ok(Unexplained {
            address: self
                .watched
                .get(&address)
                .map_or_else(|| address.to_string(), |key| key.to_string()),
            method: Method::Eth,
            block: block.clone(),
            arrived: came,
            amount: base_units(amount, "unexplained balance")?,
            reason: excerpt(reason).into_owned(),
        })
    }
}

/// A watched address's balance before and after some blocks.
type Span = (Address, U256, U256);

/// Whether `before` plus what arrived equals `after` plus what left.
fn balances_agree(before: U256, after: U256, (arrived, left): (U256, U256)) -> bool {
    before.checked_add(arrived) == after.checked_add(left)
}

/// A scanner's search for ETH moved inside calls: the balances it last read, and the tracer
/// the node answered last.
#[derive(Default)]
pub struct InternalWatch {
    /// The watched addresses' balances at the last block a scan read, by its hash: the next
    /// scan starts from there.
    last: Option<(B256, HashMap<Address, U256>)>,
    tracer: Option<Tracer>,
}

impl InternalWatch {
    /// Forgets what it read: the next scan reads its starting balances afresh.
    pub fn reset(&mut self) {
        self.last = None;
    }

    /// Finds the internal receipts (and, when `found` says so, internal outflows) of the
    /// scan's `blocks` and adds them to `range`; balance changes that no transaction explains
    /// become [`Unexplained`].
    pub async fn scan(
        &mut self,
        provider: &RootProvider,
        blocks: &[Block],
        view: &WatchView,
        found: &Found<'_>,
        range: &mut BlockRange,
    ) -> Result<(), ScanError> {
        let (watched, flows) = (found.watched, found.flows);
        let (Some(first), Some(last)) = (blocks.first(), blocks.last()) else {
            return Ok(());
        };
        let addresses: Vec<Address> = watched.iter().map(|(address, _)| *address).collect();
        // The genesis block's allocations are no payments, and it has no block before it.
        if addresses.is_empty() || first.header.number == 0 {
            self.last = None;
            return Ok(());
        }
        let heights: Vec<(u64, B256)> = blocks
            .iter()
            .map(|b| (b.header.number, b.header.hash))
            .collect();
        let (doubted, after) = self
            .doubted(provider, &addresses, (first, last), flows)
            .await?;
        let mut to_trace = locate(provider, &heights, flows, doubted).await?;
        // A receipt or outflow already recorded inside a call is traced again whatever the
        // balances say, so a rescan of its block finds it rather than taking it for gone.
        let known_heights = view
            .known
            .values()
            .filter(|k| k.transfer.id.is_internal())
            .filter_map(|k| k.block_height)
            .chain(
                view.known_outflows
                    .values()
                    .filter(|k| k.outflow.id.is_internal())
                    .map(|k| k.block_height),
            );
        for height in known_heights {
            if (first.header.number..=last.header.number).contains(&height) {
                let index = usize::try_from(height - first.header.number).unwrap_or(usize::MAX);
                to_trace.entry(index).or_default();
            }
        }
        for (index, spans) in to_trace {
            self.attribute(provider, heights[index], spans, found, range)
                .await?;
        }
        self.last = Some((last.header.hash, after));
        Ok(())
    }

    /// The addresses whose balance moved over `first..=last` otherwise than `flows` explain,
    /// each with its balances before and after, and every address's balance after.
    async fn doubted(
        &mut self,
        provider: &RootProvider,
        addresses: &[Address],
        (first, last): (&Block, &Block),
        flows: &NativeFlows,
    ) -> Result<(Vec<Span>, HashMap<Address, U256>), ScanError> {
        let mut before = self
            .balances_at(provider, addresses, first.header.parent_hash)
            .await?;
        let mut after: HashMap<Address, U256> = addresses
            .iter()
            .copied()
            .zip(balances(provider, addresses, last.header.hash).await?)
            .collect();
        let whole = first.header.number..=last.header.number;
        let unexplained = |before: &HashMap<Address, U256>, after: &HashMap<Address, U256>| {
            addresses
                .iter()
                .map(|a| (*a, before[a], after[a]))
                .filter(|(a, b, c)| !balances_agree(*b, *c, flows.explained(*a, whole.clone())))
                .collect::<Vec<Span>>()
        };
        let doubted = unexplained(&before, &after);
        if doubted.is_empty() {
            return Ok((doubted, after));
        }
        // A doubt is read again before anything is made of it, a moment later, until two reads
        // agree: a node can answer a read at its newest block with the state of the block being
        // written after it (anvil does, while it mines), and the balances the next round starts
        // from must not carry such an answer either.
        let again: Vec<Address> = doubted.iter().map(|(a, _, _)| *a).collect();
        for (at, read) in [
            (first.header.parent_hash, &mut before),
            (last.header.hash, &mut after),
        ] {
            let mut previous: Vec<U256> = again.iter().map(|a| read[a]).collect();
            for _ in 0..DOUBT_READS {
                tokio::time::sleep(DOUBT_PAUSE).await;
                let current = balances(provider, &again, at).await?;
                let settled = current == previous;
                previous = current;
                if settled {
                    break;
                }
            }
            read.extend(again.iter().copied().zip(previous));
        }
        Ok((unexplained(&before, &after), after))
    }

    /// Traces the block `(height, hash)` and adds the internal moves of watched addresses to
    /// `range`; what its trace leaves unexplained of `spans` (the doubted addresses' balances
    /// before and after it) becomes [`Unexplained`].
    async fn attribute(
        &mut self,
        provider: &RootProvider,
        (height, hash): (u64, B256),
        spans: Vec<Span>,
        found: &Found<'_>,
        range: &mut BlockRange,
    ) -> Result<(), ScanError> {
        let block = BlockId {
            height,
            hash: hash.to_string(),
        };
        let (moves, why) = match trace_block(provider, height, hash, self.tracer).await? {
            Ok((moves, tracer)) => {
                self.tracer = Some(tracer);
                (moves, None)
            }
            Err(NoTraces(why)) => (Vec::new(), Some(why)),
        };
        let inside = found.push_moves(moves, height, range)?;
        for span in spans {
            let (arrived, left) = found.flows.explained(span.0, height..=height);
            let (inside_in, inside_out) = inside.get(&span.0).copied().unwrap_or_default();
            let explained = (arrived + inside_in, left + inside_out);
            if balances_agree(span.1, span.2, explained) {
                continue;
            }
            let reason = match &why {
                Some(why) => format!(
                    "ETH moved inside a call, and the node serves no traces to say which ({why})"
                ),
                None => "no transaction of the block explains it: a validator withdrawal, a \
                         block's fees, or a self-destruct's refund"
                    .to_owned(),
            };
            range.push_unexplained(found.unexplained(span, explained, &block, &reason)?);
        }
        Ok(())
    }

    /// The balances at the block `hash`: those the last scan ended with when it ended there,
    /// read for the rest.
    async fn balances_at(
        &mut self,
        provider: &RootProvider,
        addresses: &[Address],
        hash: B256,
    ) -> Result<HashMap<Address, U256>, ScanError> {
        let mut known = match self.last.take() {
            Some((at, balances)) if at == hash => balances,
            _ => HashMap::new(),
        };
        let missing: Vec<Address> = addresses
            .iter()
            .filter(|a| !known.contains_key(*a))
            .copied()
            .collect();
        known.extend(
            missing
                .iter()
                .copied()
                .zip(balances(provider, &missing, hash).await?),
        );
        Ok(known)
    }
}

/// The blocks (by index in `heights`) where each doubted address's balance moved otherwise
/// than its transactions explain: halving the span and reading the doubted balances in its
/// middle, so a payment inside a call in a range of 50 blocks costs about six more calls.
async fn locate(
    provider: &RootProvider,
    heights: &[(u64, B256)],
    flows: &NativeFlows,
    doubted: Vec<Span>,
) -> Result<BTreeMap<usize, Vec<Span>>, ScanError> {
    let mut found: BTreeMap<usize, Vec<Span>> = BTreeMap::new();
    if doubted.is_empty() {
        return Ok(found);
    }
    let mut spans = vec![(0, heights.len() - 1, doubted)];
    while let Some((low, high, doubted)) = spans.pop() {
        if low == high {
            found.entry(low).or_default().extend(doubted);
            continue;
        }
        let middle = low + (high - low) / 2;
        let addresses: Vec<Address> = doubted.iter().map(|(a, _, _)| *a).collect();
        let at_middle = balances(provider, &addresses, heights[middle].1).await?;
        let (mut left, mut right) = (Vec::new(), Vec::new());
        for ((address, before, after), middle_balance) in doubted.into_iter().zip(at_middle) {
            let first_half = flows.explained(address, heights[low].0..=heights[middle].0);
            if !balances_agree(before, middle_balance, first_half) {
                left.push((address, before, middle_balance));
            }
            let second_half = flows.explained(address, heights[middle + 1].0..=heights[high].0);
            if !balances_agree(middle_balance, after, second_half) {
                right.push((address, middle_balance, after));
            }
        }
        if !left.is_empty() {
            spans.push((low, middle, left));
        }
        if !right.is_empty() {
            spans.push((middle + 1, high, right));
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use alloy::primitives::address;

    use super::*;

    fn shared_sample(name: &str) -> serde_json::Value {
        let path = format!(
            "{}/../../fixtures/ethereum/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
    }

    #[test]
    fn a_safe_receiving_eth_in_a_call_is_one_move_and_its_delegate_call_none() {
        let sample = shared_sample("debug_traceBlockByNumber_callTracer_safe_receipt_mainnet.json");
        let results: Vec<TraceResult<CallFrame, String>> =
            serde_json::from_value(serde_json::json!([sample["response_element"]])).unwrap();
        let moves = from_call_frames(&results).unwrap();
        let safe = address!("33b99ccbc84e8a87e10ec86386a7eb5ad434fb7e");
        let to_safe: Vec<_> = moves.iter().filter(|m| m.to == safe).collect();
        assert_eq!(to_safe.len(), 1, "{moves:?}");
        assert_eq!(to_safe[0].value, U256::from(38_926_750_000_000u64));
        assert_eq!(
            to_safe[0].from,
            address!("bc1d9760bd6ca468ca9fb5ff2cfbeac35d86c973")
        );
        assert!(
            !moves
                .iter()
                .any(|m| m.to == address!("d9db270c1b5e3bd161e8c8503c55ceabee709552")),
            "the delegate call to the singleton moves nothing"
        );
    }

    #[test]
    fn parity_traces_of_a_mainnet_transaction_give_its_internal_payment() {
        let sample = shared_sample("trace_transaction_internal_value_mainnet.json");
        let traces: Vec<LocalizedTransactionTrace> =
            serde_json::from_value(sample["record"][0]["response"]["result"].clone()).unwrap();
        let moves = from_parity_traces(&traces).unwrap();
        assert_eq!(moves.len(), 1, "{moves:?}");
        assert_eq!(
            moves[0].to,
            address!("690b9a9e9aa1c9db991c7721a92d351db4fac990")
        );
        assert_eq!(
            moves[0].from,
            address!("98c3d3183c4b8a650614ad179a1a98be0a8d6b8e")
        );
        assert_eq!(moves[0].value, U256::from(0xf38cac6d6505u64));
        assert_eq!(moves[0].ordinal, 0);
    }

    #[test]
    fn a_failed_frame_with_a_value_moves_nothing_but_keeps_its_ordinal() {
        let sample =
            shared_sample("debug_traceBlockByNumber_flatCallTracer_failed_value_mainnet.json");
        let mut traces = Vec::new();
        for per_tx in sample["record"][0]["response"]["result"]
            .as_array()
            .unwrap()
        {
            let frames: Vec<LocalizedTransactionTrace> =
                serde_json::from_value(per_tx["result"].clone()).unwrap();
            traces.extend(frames);
        }
        let failed = address!("1158c3c9a70e85d8358972810ed984c8e6ffcf0f");
        let moves = from_parity_traces(&traces).unwrap();
        assert!(!moves.iter().any(|m| m.to == failed), "{moves:?}");
    }

    /// The same transactions through both tracers give the same moves and ordinals: a rescan
    /// through another node names each receipt as before.
    #[test]
    fn both_tracers_agree_on_the_recorded_anvil_block() {
        let sample = shared_sample("anvil_internal_transfers_traces.json");
        let frames: Vec<TraceResult<CallFrame, String>> =
            serde_json::from_value(sample["debug_traceBlockByHash"].clone()).unwrap();
        let flat: Vec<LocalizedTransactionTrace> =
            serde_json::from_value(sample["trace_block"].clone()).unwrap();
        let by_frames = from_call_frames(&frames).unwrap();
        assert_eq!(by_frames, from_parity_traces(&flat).unwrap());
        // pay([a, b]) pays both; the call that reverts pays nobody, and neither does the
        // payment inside a call its parent undid.
        let paid: Vec<_> = by_frames
            .iter()
            .map(|m| (m.to, m.value, m.ordinal))
            .collect();
        assert_eq!(
            paid,
            [
                (Address::repeat_byte(0x11), U256::from(10u64.pow(15)), 0),
                (Address::repeat_byte(0x22), U256::from(2 * 10u64.pow(15)), 1),
            ]
        );
    }

    #[test]
    fn a_tracer_error_for_one_transaction_leaves_the_block_unread() {
        let results: Vec<TraceResult<CallFrame, String>> = serde_json::from_value(
            serde_json::json!([{"error": "execution timeout", "txHash": B256::repeat_byte(1)}]),
        )
        .unwrap();
        assert!(
            from_call_frames(&results)
                .unwrap_err()
                .contains("execution timeout")
        );
    }
}
