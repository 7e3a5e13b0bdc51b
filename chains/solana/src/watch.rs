//! The Solana scanner: SOL paid to the merchant's recipient under Solana Pay reference keys,
//! over the Solana RPC client.
//!
//! Finding payments costs one paginated `getSignaturesForAddress` on the recipient per scan
//! (everything that touched it since the newest signature seen), plus a bounded sweep of
//! `getSignaturesForAddress` per reference, round-robin, for payments that carry a reference
//! but pay someone else. Every new signature is verified with `getTransaction` (jsonParsed):
//! no error, the recipient's balance rose, by how much (the amount credited is that delta,
//! never what anyone claims), and which open reference it carries. Signatures seen at
//! `confirmed` are followed with `getSignatureStatuses` (256 per call) until `finalized`, or
//! reported removed when they vanish (a dropped fork).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ops::Bound;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{StreamExt as _, TryStreamExt as _};
use payrecon_chain_core::Paid;
use payrecon_chain_core::{
    Amount, Attestation, BlockId, ChainCursor, ChainEvent, ChainScanner, Finding, KeyIndex,
    KnownOutflow, KnownTransfer, Method, Network, Outflow, OutflowEvent, Probe, ReceivedAsset,
    ScanBatch, ScanError, SecretUrl, Transfer, TransferId, WatchView, WatchedLookup,
};
use solana_commitment_config::CommitmentConfig;
use solana_pubkey::Pubkey;
use solana_rpc_client::nonblocking::rpc_client::RpcClient;
use solana_rpc_client::rpc_client::GetConfirmedSignaturesForAddress2Config;
use solana_rpc_client::rpc_client::RpcClientConfig;
use solana_rpc_client_api::client_error::{Error as ClientError, ErrorKind};
use solana_rpc_client_api::config::RpcTransactionConfig;
use solana_rpc_client_api::request::RpcRequest;
use solana_rpc_client_api::response::RpcConfirmedTransactionStatusWithSignature;

use crate::sender::CappedSender;
use solana_signature::Signature;
use solana_transaction_status_client_types::{
    EncodedConfirmedTransactionWithStatusMeta, EncodedTransaction, TransactionConfirmationStatus,
    TransactionStatus, UiMessage, UiTransactionEncoding,
};

/// `getSignaturesForAddress` answers at most this many signatures per page.
const SIGNATURES_PER_PAGE: usize = 1000;

/// `getSignatureStatuses` takes at most this many signatures per call.
const STATUSES_PER_CALL: usize = 256;

/// Reference listings requested at once.
const REQUESTS_IN_FLIGHT: usize = 8;

/// After a restart the recipient is listed down to this many slots below the committed
/// cursor (about a minute): anything older was handled before the restart, even if the
/// cursor's own signature has since vanished with its fork.
const RESUME_MARGIN_SLOTS: u64 = 150;

/// Where and how to watch Solana.
#[derive(Clone, Debug)]
pub struct SolanaSettings {
    /// The JSON-RPC endpoint.
    pub url: SecretUrl,
    /// The merchant's recipient account every payment goes to.
    pub recipient: Pubkey,
    /// References swept per scan for payments to another recipient.
    pub references_per_scan: usize,
    /// Per-request timeout, connecting included.
    pub timeout: Duration,
    /// The largest answer read; a larger one fails the request (and the watcher retries).
    pub max_answer_bytes: usize,
}

impl SolanaSettings {
    /// Settings for `url` paying `recipient`: 100 references swept per scan, 30 s per request.
    pub fn new(url: impl Into<SecretUrl>, recipient: Pubkey) -> SolanaSettings {
        SolanaSettings {
            url: url.into(),
            recipient,
            references_per_scan: 100,
            timeout: Duration::from_secs(30),
            max_answer_bytes: 32 << 20,
        }
    }
}

/// Scans Solana through one RPC endpoint.
pub struct SolanaScanner {
    settings: SolanaSettings,
    client: Option<Arc<RpcClient>>,
    /// The newest signature listed per address (the recipient and each reference) this
    /// session, with its slot when listed in it: the next listing stops there. A reset forgets
    /// them and lists afresh; what the engine already knows is not reported twice.
    newest: HashMap<Pubkey, (Signature, Option<u64>)>,
    /// The open references, kept in step with the view's keys.
    references: KeyIndex<Pubkey>,
    /// The same, in the order the sweep visits them.
    sweep_order: BTreeSet<Pubkey>,
    /// Where the reference sweep continues.
    next_swept: Option<Pubkey>,
    /// Answers found incomplete since the scanner was made.
    incomplete_answers: u64,
}

impl SolanaScanner {
    /// Brings the watched references up to date with the view, keeping the sweep's order.
    fn follow_references(&mut self, view: &WatchView) -> Result<(), ScanError> {
        let changes = self
            .references
            .sync(&view.watch_keys, Pubkey::from_str)
            .map_err(|(key, e)| {
                ScanError::Fatal(format!("watch key {key:?} is not a Solana public key: {e}"))
            })?;
        if changes.rebuilt {
            self.sweep_order.clear();
        }
        self.sweep_order
            .extend(changes.added.iter().map(|(reference, _)| *reference));
        for (reference, _) in &changes.removed {
            self.sweep_order.remove(reference);
        }
        Ok(())
    }

    /// What to look at this round: the recipient's new signatures (back to `oldest_slot`
    /// after a restart), and a slice of the references in turn; with where the next slice
    /// starts.
    async fn listings(
        &self,
        client: &RpcClient,
        oldest_slot: Option<u64>,
    ) -> Result<(Listings, Option<Pubkey>), ScanError> {
        let recipient = self.settings.recipient;
        let mut listed: Listings = vec![(
            recipient,
            self.new_signatures(client, &recipient, oldest_slot).await?,
        )];
        let budget = self
            .settings
            .references_per_scan
            .min(self.sweep_order.len());
        let start = self.next_swept.map_or(Bound::Unbounded, Bound::Included);
        let due: Vec<Pubkey> = self
            .sweep_order
            .range((start, Bound::Unbounded))
            .chain(self.sweep_order.range((Bound::Unbounded, start)))
            .take(budget)
            .copied()
            .collect();
        let next_swept = due.last().and_then(|last| {
            self.sweep_order
                .range((Bound::Excluded(*last), Bound::Unbounded))
                .next()
                .or_else(|| self.sweep_order.first())
                .copied()
        });
        let swept: Listings = futures_util::stream::iter(due)
            .map(|reference| async move {
                let signatures = self.new_signatures(client, &reference, None).await?;
                Ok::<_, ScanError>((reference, signatures))
            })
            .buffered(REQUESTS_IN_FLIGHT)
            .try_collect()
            .await?;
        listed.extend(swept);
        Ok((listed, next_swept))
    }

    /// Every listed transaction not recorded yet, fetched and verified: what it moved to the
    /// recipient under a known reference, and what the recipient sent out, each with its
    /// finality, slot and time.
    async fn verified(
        &self,
        client: &RpcClient,
        view: &WatchView,
        listed: &Listings,
    ) -> Result<Verified, ScanError> {
        let known: HashSet<&str> = view
            .known
            .keys()
            .chain(view.known_outflows.keys())
            .map(|id| id.txid.as_str())
            .collect();
        let mut found = Verified::default();
        let mut looked_at: HashSet<&str> = HashSet::new();
        for (address, listing) in listed {
            for status in listing {
                // A failed transaction moves no SOL to anyone, but the recipient's own failed
                // transaction still cost it the fee. One already recorded only moves in
                // finality, followed by `finality`.
                let own = *address == self.settings.recipient;
                if (status.err.is_some() && !own)
                    || !looked_at.insert(status.signature.as_str())
                    || known.contains(status.signature.as_str())
                {
                    continue;
                }
                let finalized = matches!(
                    status.confirmation_status,
                    Some(TransactionConfirmationStatus::Finalized)
                );
                let tx = transaction(client, &status.signature).await?;
                let (confirmations, block) = if finalized {
                    (1, Some(tx.slot))
                } else {
                    (0, None)
                };
                let seen = status
                    .block_time
                    .map_or(view.now_ms, |t| t.saturating_mul(1000).min(view.now_ms));
                if let Some(transfer) = verify(
                    &status.signature,
                    &tx,
                    &self.settings.recipient,
                    &self.references,
                )? {
                    found.transfers.push((transfer, confirmations, block, seen));
                }
                if let Some(outflow) = outflow_of(&status.signature, &tx, &self.settings.recipient)?
                {
                    found.outflows.push((outflow, confirmations, tx.slot, seen));
                }
            }
        }
        Ok(found)
    }
    /// A scanner that connects on its first scan.
    pub fn new(settings: SolanaSettings) -> SolanaScanner {
        SolanaScanner {
            settings,
            client: None,
            newest: HashMap::new(),
            incomplete_answers: 0,
            references: KeyIndex::default(),
            sweep_order: BTreeSet::new(),
            next_swept: None,
        }
    }

    pub(crate) fn client(&mut self) -> Result<Arc<RpcClient>, ScanError> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        let sender = CappedSender::new(
            self.settings.url.clone(),
            self.settings.timeout,
            self.settings.max_answer_bytes,
        )?;
        let client = Arc::new(RpcClient::new_sender(
            sender,
            RpcClientConfig::with_commitment(CommitmentConfig::confirmed()),
        ));
        Ok(self.client.insert(client).clone()).clone()
    }

    /// Signatures of `address` newer than the last listing (and not in slots below
    /// `oldest_slot`), newest first, page by page.
    async fn new_signatures(
        &self,
        client: &RpcClient,
        address: &Pubkey,
        oldest_slot: Option<u64>,
    ) -> Result<Vec<RpcConfirmedTransactionStatusWithSignature>, ScanError> {
        let newest = self.newest.get(address).copied();
        let until = newest.map(|(signature, _)| signature);
        let mut all = Vec::new();
        let mut before = None;
        loop {
            let page = client
                .get_signatures_for_address_with_config(
                    address,
                    GetConfirmedSignaturesForAddress2Config {
                        before,
                        until,
                        limit: Some(SIGNATURES_PER_PAGE),
                        commitment: Some(CommitmentConfig::confirmed()),
                    },
                )
                .await
                .map_err(|e| classify("getSignaturesForAddress", e))?;
            // A node that does not know the `until` signature (it is behind the one that
            // listed it) ignores it and answers its newest signatures (solana issue 24620):
            // older than what was handled, and believing them would move the listing back.
            if let Some((until, Some(until_slot))) = newest
                && let Some(older) = page.iter().find(|listed| {
                    listed.slot < until_slot || listed.signature == until.to_string()
                })
            {
                return Err(ScanError::incomplete(format!(
                    "getSignaturesForAddress({address}) listed {} of slot {} past its `until` \
                     {until} of slot {until_slot}: the node does not know that signature yet",
                    older.signature, older.slot
                )));
            }
            let full = page.len() == SIGNATURES_PER_PAGE;
            let reached_oldest = page
                .last()
                .is_some_and(|last| oldest_slot.is_some_and(|oldest| last.slot < oldest));
            before = match page.last() {
                Some(last) => Some(signature(&last.signature)?),
                None => None,
            };
            all.extend(page);
            if !full || reached_oldest {
                return Ok(all);
            }
        }
    }
}

impl ChainScanner for SolanaScanner {
    fn network(&self) -> Network {
        Network::Solana
    }

    fn source(&self) -> &SecretUrl {
        &self.settings.url
    }

    async fn scan(&mut self, view: &WatchView) -> Result<ScanBatch, ScanError> {
        let client = self.client()?;
        let recipient = self.settings.recipient;
        self.follow_references(view)?;
        let tip = client
            .get_slot_with_commitment(CommitmentConfig::confirmed())
            .await
            .map_err(|e| classify("getSlot", e))?;

        // After a restart the recipient's listing resumes at the committed cursor: its hash is
        // the newest recipient signature handled, its height the slot of that scan.
        let resumed = view.cursor.as_ref().and_then(|cursor| {
            Signature::from_str(&cursor.tip.hash)
                .ok()
                .map(|newest| (newest, cursor.tip.height))
        });
        if let Some((newest, _)) = resumed {
            self.newest.entry(recipient).or_insert((newest, None));
        }
        let oldest_slot = resumed.map(|(_, slot)| slot.saturating_sub(RESUME_MARGIN_SLOTS));

        let (listed, next_swept) = self
            .listings(&client, oldest_slot)
            .await
            .inspect_err(|e| self.incomplete_answers += u64::from(e.is_incomplete()))?;
        let found = self.verified(&client, view, &listed).await?;
        // Transactions listed after `getSlot` answered may sit in newer slots: the tip is at
        // least the newest slot seen in this round.
        let tip = found
            .transfers
            .iter()
            .filter_map(|(_, _, block, _)| *block)
            .chain(found.outflows.iter().map(|(_, _, slot, _)| *slot))
            .fold(tip, u64::max);
        let mut events: Vec<ChainEvent> = found
            .transfers
            .into_iter()
            .map(
                |(transfer, confirmations, block_height, seen_at_ms)| ChainEvent::Observed {
                    transfer,
                    confirmations,
                    block_height,
                    seen_at_ms,
                    tip_height: tip,
                },
            )
            .collect();
        events.extend(finality(&client, view, tip).await?);
        let mut outflows: Vec<OutflowEvent> = found
            .outflows
            .into_iter()
            .map(
                |(outflow, confirmations, block_height, seen_at_ms)| OutflowEvent::Sent {
                    outflow,
                    confirmations,
                    block_height,
                    seen_at_ms,
                    tip_height: tip,
                },
            )
            .collect();
        outflows.extend(outflow_finality(&client, view, tip).await?);

        // Everything listed is handled: the next listings stop at the newest signatures.
        // References of closed intents are not listed any more: forget them.
        for (address, signatures) in &listed {
            if let Some(newest) = signatures.first() {
                self.newest
                    .insert(*address, (signature(&newest.signature)?, Some(newest.slot)));
            }
        }
        let references = &self.references;
        self.newest
            .retain(|address, _| *address == recipient || references.contains(address));
        self.next_swept = next_swept;
        let hash = match self.newest.get(&recipient) {
            Some((newest, _)) => newest.to_string(),
            None => format!("slot:{tip}"),
        };
        Ok(ScanBatch {
            events,
            outflows,
            cursor: ChainCursor {
                tip: BlockId { height: tip, hash },
                checkpoints: Vec::new(),
            },
            more: false,
            head: tip,
            unreadable: Vec::new(),
            unexplained: Vec::new(),
        })
    }

    /// The signature's status for its slot and finality (1 once finalized, as a scan
    /// reports it), then the transaction itself, decoded as a scan decodes it.
    async fn attest(
        &mut self,
        transfers: &[KnownTransfer],
        _settle_depth: u32,
    ) -> Result<Vec<Attestation>, ScanError> {
        let client = self.client()?;
        let mut answers = Vec::with_capacity(transfers.len());
        for chunk in transfers.chunks(STATUSES_PER_CALL) {
            let found =
                statuses(&client, chunk.iter().map(|k| k.transfer.id.txid.as_str())).await?;
            for (known, status) in chunk.iter().zip(found) {
                let reported = &known.transfer;
                let Some(status) = status else {
                    answers.push(Attestation::Missing(
                        "no such transaction is known there".into(),
                    ));
                    continue;
                };
                if status.err.is_some() {
                    answers.push(Attestation::Missing("it failed there".into()));
                    continue;
                }
                let tx = transaction(&client, &reported.id.txid).await?;
                let reference = Pubkey::from_str(&reported.to_address).map_err(|e| {
                    ScanError::Fatal(format!("{} is not a Solana key: {e}", reported.to_address))
                })?;
                let references = HashMap::from([(reference, reported.to_address.as_str())]);
                let found = verify(
                    &reported.id.txid,
                    &tx,
                    &self.settings.recipient,
                    &references,
                )?;
                let block = BlockId {
                    height: status.slot,
                    hash: format!("slot:{}", status.slot),
                };
                answers.push(Attestation::of_found(
                    reported,
                    found.as_ref(),
                    Some(block),
                    u32::from(is_final(&status)),
                ));
            }
        }
        Ok(answers)
    }

    /// The signature's status and the transaction's SOL balance change at `to_address`
    /// (what a refund in SOL paid it; no token is accepted on Solana).
    async fn paid_to(
        &mut self,
        txid: &str,
        to_address: &str,
        asset: &ReceivedAsset,
        _seen_at: Option<u64>,
    ) -> Result<Option<Paid>, ScanError> {
        if *asset
            != (ReceivedAsset::Method {
                method: Method::Sol,
            })
        {
            return Ok(None);
        }
        let client = self.client()?;
        let Some(Some(status)) = statuses(&client, std::iter::once(txid)).await?.pop() else {
            return Ok(None);
        };
        let block = Some(BlockId {
            height: status.slot,
            hash: format!("slot:{}", status.slot),
        });
        let confirmations = u32::from(is_final(&status));
        if status.err.is_some() {
            return Ok(Some(Paid {
                amount: Amount::ZERO,
                block,
                confirmations,
            }));
        }
        let changes = balance_changes(txid, &transaction(&client, txid).await?)?;
        let received = changes
            .keys
            .iter()
            .zip(&changes.deltas)
            .filter(|(key, delta)| key.as_str() == to_address && **delta > 0)
            .map(|(_, delta)| *delta)
            .sum::<i128>();
        Ok(Some(Paid {
            amount: Amount::from_base_units(u128::try_from(received).unwrap_or(0)),
            block,
            confirmations,
        }))
    }

    fn reset(&mut self) {
        self.client = None;
        self.newest.clear();
    }

    fn incomplete_answers(&self) -> u64 {
        self.incomplete_answers
    }

    async fn probe(&mut self) -> Result<Probe, ScanError> {
        let client = self.client()?;
        let tip = client
            .get_slot_with_commitment(CommitmentConfig::confirmed())
            .await
            .map_err(|e| classify("getSlot", e))?;
        let recipient = self.settings.recipient;
        let lamports = client
            .get_balance(&recipient)
            .await
            .map_err(|e| classify("getBalance", e))?;
        // A recipient that never held SOL does not exist yet: a payment below the rent-exempt
        // minimum to it would fail, so the merchant funds it first.
        let outcome = if lamports > 0 {
            Ok(format!("{lamports} lamports"))
        } else {
            Err(format!(
                "{recipient} holds nothing: fund it (rent-exempt) before taking payments"
            ))
        };
        Ok(Probe {
            tip_height: tip,
            tip_time_ms: None,
            syncing: false,
            findings: vec![Finding {
                method: Method::Sol,
                what: format!("recipient {recipient}"),
                outcome,
                essential: true,
            }],
        })
    }
}

/// What a transaction did for the merchant: SOL the recipient received under an open
/// reference, SOL it received under none (an unmatched receipt), or a reference used to pay
/// someone else (an exception, never a credit). `None` for anything else (the recipient paid
/// out, or neither it nor a reference is involved).
fn verify(
    signature: &str,
    tx: &EncodedConfirmedTransactionWithStatusMeta,
    recipient: &Pubkey,
    references: &impl WatchedLookup<Pubkey>,
) -> Result<Option<Transfer>, ScanError> {
    if tx
        .transaction
        .meta
        .as_ref()
        .is_some_and(|meta| meta.err.is_some())
    {
        return Ok(None);
    }
    let BalanceChanges { keys, deltas, .. } = balance_changes(signature, tx)?;
    let delta = |index: usize| deltas[index];
    let recipient_text = recipient.to_string();
    let received = keys
        .iter()
        .position(|k| *k == recipient_text)
        .map_or(0, delta);
    let reference = keys.iter().find_map(|k| {
        Pubkey::from_str(k)
            .ok()
            .and_then(|pk| references.watch_key(&pk).map(str::to_owned))
    });
    let id = TransferId {
        network: Network::Solana,
        txid: signature.to_owned(),
        position: 0,
    };
    let sol = |lamports: i128| Amount::from_base_units(u128::try_from(lamports).unwrap_or(0));
    Ok(match (reference, received > 0) {
        (Some(reference), true) => Some(Transfer {
            id,
            to_address: reference,
            asset: ReceivedAsset::Method {
                method: Method::Sol,
            },
            amount: sol(received),
            from_address: None,
        }),
        (None, true) => Some(Transfer {
            id,
            to_address: recipient_text,
            asset: ReceivedAsset::Method {
                method: Method::Sol,
            },
            amount: sol(received),
            from_address: None,
        }),
        (Some(reference), false) => {
            // The largest balance increase is where the money went instead.
            let (elsewhere, amount) = (0..keys.len())
                .map(|i| (i, delta(i)))
                .max_by_key(|(_, d)| *d)
                .filter(|(_, d)| *d > 0)
                .map_or((String::from("nobody"), 0), |(i, d)| (keys[i].clone(), d));
            Some(Transfer {
                id,
                to_address: reference,
                asset: ReceivedAsset::misdirected(Method::Sol, &elsewhere.to_string()),
                amount: sol(amount),
                from_address: None,
            })
        }
        (None, false) => None,
    })
}

/// What a transaction took from the recipient: the fee when the recipient paid it (first
/// account key, the fee payer), failed or not, and the rest of its balance's fall as the
/// amount sent, to the one account whose balance rose by exactly that much (`None` when it
/// was split). `None` when the recipient's balance did not fall.
fn outflow_of(
    signature: &str,
    tx: &EncodedConfirmedTransactionWithStatusMeta,
    recipient: &Pubkey,
) -> Result<Option<Outflow>, ScanError> {
    let BalanceChanges { keys, deltas, fee } = balance_changes(signature, tx)?;
    let delta = |index: usize| deltas[index];
    let recipient_text = recipient.to_string();
    let Some(index) = keys.iter().position(|k| *k == recipient_text) else {
        return Ok(None);
    };
    let fell = -delta(index);
    if fell <= 0 {
        return Ok(None);
    }
    let fee = if index == 0 {
        i128::from(fee).min(fell)
    } else {
        0
    };
    let amount = fell - fee;
    let mut rose = (0..keys.len()).filter(|i| *i != index && delta(*i) == amount);
    let to_address = match (amount > 0, rose.next(), rose.next()) {
        (true, Some(only), None) => Some(keys[only].clone()),
        _ => None,
    };
    let lamports = |value: i128| Amount::from_base_units(u128::try_from(value).unwrap_or(0));
    Ok(Some(Outflow {
        id: TransferId {
            network: Network::Solana,
            txid: signature.to_owned(),
            position: 0,
        },
        spends: None,
        from_address: recipient_text,
        asset: ReceivedAsset::Method {
            method: Method::Sol,
        },
        amount: lamports(amount),
        fee: lamports(fee),
        to_address,
    }))
}

/// What a transaction did to its accounts' SOL: the account keys in order (the fee payer
/// first), each one's balance change, and the fee.
struct BalanceChanges {
    keys: Vec<String>,
    deltas: Vec<i128>,
    fee: u64,
}

/// The [`BalanceChanges`] of a jsonParsed transaction, refused when its balances do not line
/// up with its keys.
fn balance_changes(
    signature: &str,
    tx: &EncodedConfirmedTransactionWithStatusMeta,
) -> Result<BalanceChanges, ScanError> {
    let malformed = |what: &str| ScanError::Fatal(format!("getTransaction {signature}: {what}"));
    let Some(meta) = &tx.transaction.meta else {
        return Err(malformed("no status meta"));
    };
    let keys: Vec<String> = match &tx.transaction.transaction {
        EncodedTransaction::Json(ui) => match &ui.message {
            UiMessage::Parsed(message) => message
                .account_keys
                .iter()
                .map(|a| a.pubkey.clone())
                .collect(),
            UiMessage::Raw(message) => message.account_keys.clone(),
        },
        _ => return Err(malformed("not jsonParsed")),
    };
    if keys.len() != meta.pre_balances.len() || keys.len() != meta.post_balances.len() {
        return Err(malformed("balances do not line up with the account keys"));
    }
    let deltas = meta
        .pre_balances
        .iter()
        .zip(&meta.post_balances)
        .map(|(pre, post)| i128::from(*post) - i128::from(*pre))
        .collect();
    Ok(BalanceChanges {
        keys,
        deltas,
        fee: meta.fee,
    })
}

/// The statuses of recorded signatures, with history: one finalized while the watcher was
/// away is older than the node's recent-status cache, and must not look vanished.
async fn statuses<'k>(
    client: &RpcClient,
    txids: impl Iterator<Item = &'k str>,
) -> Result<Vec<Option<TransactionStatus>>, ScanError> {
    let signatures: Vec<Signature> = txids.map(signature).collect::<Result<_, _>>()?;
    Ok(client
        .get_signature_statuses_with_history(&signatures)
        .await
        .map_err(|e| classify("getSignatureStatuses", e))?
        .value)
}

/// Whether a status says finalized (`confirmations: null` is how older nodes say it).
fn is_final(status: &TransactionStatus) -> bool {
    status.confirmations.is_none()
        || matches!(
            status.confirmation_status,
            Some(TransactionConfirmationStatus::Finalized)
        )
}

/// What became of recorded signatures not final yet: `Some(slot)` once finalized, `None`
/// when gone with their fork; those still only confirmed are left out.
async fn settled<'k, T>(
    client: &RpcClient,
    pending: Vec<&'k T>,
    txid: impl Fn(&T) -> &str,
) -> Result<Vec<(&'k T, Option<u64>)>, ScanError> {
    let mut settled = Vec::new();
    for chunk in pending.chunks(STATUSES_PER_CALL) {
        let found = statuses(client, chunk.iter().map(|k| txid(k))).await?;
        for (k, status) in chunk.iter().zip(found) {
            match status {
                None => settled.push((*k, None)),
                Some(status) if is_final(&status) => settled.push((*k, Some(status.slot))),
                Some(_) => {}
            }
        }
    }
    Ok(settled)
}

/// Recorded outflows that were not final: finalized since (and booked then) or gone with
/// their fork.
async fn outflow_finality(
    client: &RpcClient,
    view: &WatchView,
    tip: u64,
) -> Result<Vec<OutflowEvent>, ScanError> {
    let pending: Vec<&KnownOutflow> = view
        .known_outflows
        .values()
        .filter(|k| k.confirmations == 0)
        .collect();
    let settled = settled(client, pending, |k| k.outflow.id.txid.as_str()).await?;
    Ok(settled
        .into_iter()
        .map(|(k, slot)| match slot {
            None => OutflowEvent::Removed {
                id: k.outflow.id.clone(),
                tip_height: tip.max(k.tip_height),
            },
            Some(slot) => OutflowEvent::Sent {
                outflow: k.outflow.clone(),
                confirmations: 1,
                block_height: slot,
                seen_at_ms: k.seen_at_ms,
                tip_height: tip.max(k.tip_height).max(slot),
            },
        })
        .collect())
}

/// Recorded transfers that were not final: finalized since or gone with their fork.
async fn finality(
    client: &RpcClient,
    view: &WatchView,
    tip: u64,
) -> Result<Vec<ChainEvent>, ScanError> {
    let pending: Vec<&KnownTransfer> = view
        .known
        .values()
        .filter(|k| k.confirmations == 0)
        .collect();
    let settled = settled(client, pending, |k| k.transfer.id.txid.as_str()).await?;
    Ok(settled
        .into_iter()
        .map(|(k, slot)| match slot {
            None => ChainEvent::Removed {
                id: k.transfer.id.clone(),
                tip_height: tip.max(k.tip_height),
            },
            Some(slot) => ChainEvent::Observed {
                transfer: k.transfer.clone(),
                confirmations: 1,
                block_height: Some(slot),
                seen_at_ms: k.seen_at_ms,
                tip_height: tip.max(k.tip_height).max(slot),
            },
        })
        .collect())
}

/// Each address listed this round with its new signatures, newest first.
type Listings = Vec<(Pubkey, Vec<RpcConfirmedTransactionStatusWithSignature>)>;

/// What one round's new transactions did: receipts, and what left the recipient, each with
/// its confirmations (1 once finalized), slot and time.
#[derive(Default)]
struct Verified {
    transfers: Vec<(Transfer, u32, Option<u64>, i64)>,
    outflows: Vec<(Outflow, u32, u64, i64)>,
}

/// One transaction, jsonParsed, at `confirmed`.
async fn transaction(
    client: &RpcClient,
    signature: &str,
) -> Result<EncodedConfirmedTransactionWithStatusMeta, ScanError> {
    let config = RpcTransactionConfig {
        encoding: Some(UiTransactionEncoding::JsonParsed),
        commitment: Some(CommitmentConfig::confirmed()),
        max_supported_transaction_version: Some(0),
    };
    let tx: Option<EncodedConfirmedTransactionWithStatusMeta> = client
        .send(
            RpcRequest::GetTransaction,
            serde_json::json!([signature, config]),
        )
        .await
        .map_err(|e| classify("getTransaction", e))?;
    // Listed but not served yet by this node: ask again next scan.
    tx.ok_or_else(|| ScanError::Transient(format!("getTransaction {signature} answered null")))
}

fn signature(text: &str) -> Result<Signature, ScanError> {
    Signature::from_str(text)
        .map_err(|e| ScanError::Fatal(format!("{text:?} is not a transaction signature: {e}")))
}

/// Timeouts, refused connections, rate limits (after the client's own 429 retries) and node
/// errors are temporary; an answer that does not decode is not.
pub(crate) fn classify(call: &str, error: ClientError) -> ScanError {
    match error.kind() {
        ErrorKind::SerdeJson(_) => ScanError::Fatal(format!(
            "{call}: the node answered something unreadable: {}",
            payrecon_chain_core::excerpt(&error.to_string())
        )),
        _ => ScanError::Transient(format!("{call}: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RECIPIENT: &str = "G1wZ113tiUHdSpQEBcid8n1x8BAvcWZoZgxPKxgE5B7o";

    fn reference() -> Pubkey {
        Pubkey::new_from_array([9; 32])
    }

    /// The recorded Solana Pay transaction, its placeholder reference replaced by a real key.
    fn recorded_transaction() -> serde_json::Value {
        let text = include_str!(
            "../../../fixtures/solana/getTransaction_jsonParsed_solana_pay_reference_SYNTHETIC.json"
        )
        .replace(
            "Ref111111111111111111111111111111111111111",
            &reference().to_string(),
        );
        let fixture: serde_json::Value = serde_json::from_str(&text).unwrap();
        fixture["response"]["result"].clone()
    }

    fn verified(value: serde_json::Value) -> Option<Result<Option<Transfer>, ScanError>> {
        let tx: EncodedConfirmedTransactionWithStatusMeta = serde_json::from_value(value).ok()?;
        let references = HashMap::from([(reference(), "order-key")]);
        Some(verify(
            "sig",
            &tx,
            &Pubkey::from_str(RECIPIENT).unwrap(),
            &references,
        ))
    }

    #[test]
    fn the_recorded_payment_pays_the_recipient_under_its_reference() {
        let transfer = verified(recorded_transaction()).unwrap().unwrap().unwrap();
        assert_eq!(transfer.to_address, "order-key");
        assert_eq!(transfer.amount.base_units(), 10_000_000);
        assert_eq!(
            transfer.asset,
            ReceivedAsset::Method {
                method: Method::Sol
            }
        );
    }

    proptest::proptest! {
        /// A corrupted `getTransaction` answer is refused, ignored, or read as a transfer of
        /// a positive amount to the reference or the recipient; never a panic.
        #[test]
        fn corrupted_transactions_never_panic(value in payrecon_chain_core::fuzz::mutated_n(&recorded_transaction())) {
            if let Some(Ok(Some(transfer))) = verified(value) {
                proptest::prop_assert!(["order-key", RECIPIENT].contains(&transfer.to_address.as_str()));
                if transfer.asset == (ReceivedAsset::Method { method: Method::Sol }) {
                    proptest::prop_assert!(transfer.amount.base_units() > 0);
                }
            }
        }

        #[test]
        fn any_signature_text_parses_or_is_refused(text in ".{0,100}|[1-9A-HJ-NP-Za-km-z]{80,92}") {
            let _ = signature(&text);
        }
    }
}
