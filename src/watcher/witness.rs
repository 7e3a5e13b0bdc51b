//! Witnesses: before a receipt is credited, every second source configured for its network
//! (`witness_urls`) must hold it on its own — the same transaction, in the same block, paying
//! the same address the same amount of the same asset, at least as deep as the network's
//! confirmations — or a source that invents a payment would decide what the shop credits.
//!
//! Witnesses are asked per receipt, once it reaches the network's confirmations on the
//! watcher's source, not per block: a round without such a receipt asks nobody and reads
//! nothing more. Until every witness holds it, the receipt is reported one confirmation short
//! of what crediting needs, so the matcher sees it confirming and credits nothing: no
//! settlement, no balance credit, no webhook that says paid. The source keeps reporting its
//! true depth each round, and the witnesses are asked again (at most every
//! [`ASK_AGAIN_AFTER`]) until they hold it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use payrecon_chain_core::{
    Attestation, BlockId, ChainEvent, KnownTransfer, Network, ReceivedAsset, ScanBatch, TransferId,
};

use crate::audit::Rechecker;
use crate::config::WitnessPolicy;
use crate::engine::Engine;
use crate::error::Error;
use crate::networks::WitnessPlan;
use crate::store::witness::{Verdicts, WitnessCheck, WitnessState, checks_of};

/// How soon a receipt's witnesses are asked again after an answer that did not release it.
pub(crate) const ASK_AGAIN_AFTER: Duration = Duration::from_secs(5);

/// Receipts asked about per round; the others wait, held, for the next round.
const RECEIPTS_PER_ROUND: usize = 50;

/// How long one witness may take to answer about one receipt.
const ANSWER_DEADLINE: Duration = Duration::from_secs(30);

/// A network's witnesses, held by its watcher.
pub(crate) struct Witnesses {
    sources: Vec<Rechecker>,
    policy: WitnessPolicy,
    wait: chrono::Duration,
    /// The confirmations below which nothing of the network is credited.
    credit_depth: u32,
    /// The deepest any receipt must be: how deep an answer counts confirmations.
    settle_depth: u32,
    /// When each held receipt's witnesses were last asked, by this process.
    asked: HashMap<TransferId, Instant>,
}

/// What the witnesses said of one receipt, taken together.
enum Judgement {
    /// Every witness holds it, as deep as crediting needs.
    Holds,
    /// One does not hold it yet: behind, unreachable, or not as deep (silence).
    Silent(String),
    /// One knows no such transaction.
    Unknown(String),
    /// One holds it otherwise: another amount, address or asset, or another block.
    Contradicts(String),
}

impl Witnesses {
    /// The witnesses of `network` under `engine`'s settings; `None` when it has none.
    pub(crate) fn of(engine: &Engine, network: Network) -> Option<Witnesses> {
        let settings = engine.payment_settings();
        let plan: &WitnessPlan = settings.witnesses.get(&network)?;
        let rule = settings.policy.confirmations.get(&network);
        Some(Witnesses {
            sources: plan.sources.iter().map(Rechecker::witness).collect(),
            policy: plan.policy,
            wait: chrono::Duration::from_std(plan.wait).unwrap_or(chrono::Duration::MAX),
            credit_depth: rule.map_or(1, |r| r.confirmations).max(1),
            settle_depth: rule.map_or(1, |r| r.deepest()),
            asked: HashMap::new(),
        })
    }

    /// Holds back, in `batch`, every receipt of one of the shop's methods that reached the
    /// network's confirmations and that the witnesses have not all confirmed, asking them
    /// where due; returns what to record with the batch. `source` names the watcher's source
    /// in what operators read.
    pub(crate) async fn review(
        &mut self,
        engine: &Engine,
        batch: &mut ScanBatch,
        source: &str,
        now: DateTime<Utc>,
    ) -> Result<Verdicts, Error> {
        let credit_depth = self.credit_depth;
        let candidates = candidates(batch, credit_depth);
        let mut verdicts = Verdicts::default();
        if candidates.is_empty() {
            return Ok(verdicts);
        }
        let ids: Vec<&TransferId> = candidates
            .iter()
            .map(|i| batch.events[*i].transfer_id())
            .collect();
        let recorded: HashMap<TransferId, WitnessCheck> = {
            let mut conn = engine.db().pool().acquire().await?;
            checks_of(&mut conn, &ids)
                .await?
                .into_iter()
                .map(|c| (c.id.clone(), c))
                .collect()
        };
        // Those the witnesses are asked about now; the others stay held until their turn.
        let mut due: Vec<(usize, KnownTransfer)> = Vec::new();
        for index in candidates {
            let id = batch.events[index].transfer_id();
            if let ChainEvent::Removed { .. } = batch.events[index] {
                if recorded.contains_key(id) {
                    verdicts.checks.push(WitnessCheck {
                        id: id.clone(),
                        state: WitnessState::Waiting,
                        first_asked_ms: now.timestamp_millis(),
                        detail: "a reorg took it out: the witnesses are asked again if it returns"
                            .into(),
                    });
                }
                continue;
            }
            if recorded.get(id).is_some_and(|c| c.state.releases()) {
                continue;
            }
            let ask = self
                .asked
                .get(id)
                .is_none_or(|at| at.elapsed() >= ASK_AGAIN_AFTER);
            match &batch.events[index] {
                ChainEvent::Observed {
                    transfer,
                    confirmations,
                    block_height,
                    seen_at_ms,
                    tip_height,
                } if ask && due.len() < RECEIPTS_PER_ROUND => due.push((
                    index,
                    KnownTransfer {
                        transfer: transfer.clone(),
                        confirmations: *confirmations,
                        block_height: *block_height,
                        tip_height: *tip_height,
                        seen_at_ms: *seen_at_ms,
                    },
                )),
                _ => hold(&mut batch.events[index], credit_depth),
            }
        }
        if due.is_empty() {
            return Ok(verdicts);
        }
        let asked: Vec<KnownTransfer> = due.iter().map(|(_, known)| known.clone()).collect();
        let judgements = self.judge(&asked, &block_hashes(batch)).await;
        for ((index, known), judgement) in due.into_iter().zip(judgements) {
            let id = known.transfer.id.clone();
            self.asked.insert(id.clone(), Instant::now());
            let check = recorded.get(&id);
            let first_asked_ms = check.map_or(now.timestamp_millis(), |c| c.first_asked_ms);
            let waited = now.timestamp_millis() - first_asked_ms >= self.wait.num_milliseconds();
            let reported = reported(&known, source);
            let (state, detail) = self.verdict(&id, judgement, waited);
            match state {
                WitnessState::Confirmed => {
                    self.asked.remove(&id);
                    verdicts.confirmed.push(id.clone());
                }
                WitnessState::Unwitnessed => {
                    self.asked.remove(&id);
                }
                WitnessState::Disagrees => {
                    // Once, when it comes to disagree; it is asked again every few seconds.
                    if check.is_none_or(|c| c.state != WitnessState::Disagrees) {
                        tracing::warn!(network = %id.network, transfer = %id, %detail, "a witness does not confirm a receipt: held for operators");
                    }
                    verdicts
                        .disagreements
                        .push((id.clone(), format!("{reported}; {detail}")));
                    hold(&mut batch.events[index], credit_depth);
                }
                WitnessState::Waiting => hold(&mut batch.events[index], credit_depth),
            }
            verdicts.checks.push(WitnessCheck {
                id,
                state,
                first_asked_ms,
                detail,
            });
        }
        Ok(verdicts)
    }

    /// Where a receipt stands after `judgement`, and why: silence and an unknown transaction
    /// hold it only once the wait passed (`waited`), and silence then as the policy says.
    fn verdict(
        &self,
        id: &TransferId,
        judgement: Judgement,
        waited: bool,
    ) -> (WitnessState, String) {
        match judgement {
            Judgement::Holds => (WitnessState::Confirmed, "every witness holds it".to_owned()),
            Judgement::Contradicts(answer) => (WitnessState::Disagrees, answer),
            Judgement::Unknown(answer) if waited => (WitnessState::Disagrees, answer),
            Judgement::Silent(answer) if waited => match self.policy {
                WitnessPolicy::Hold => (WitnessState::Disagrees, answer),
                WitnessPolicy::Warn => {
                    tracing::warn!(network = %id.network, transfer = %id, %answer, "credited without its witnesses under witness_policy = \"warn\"");
                    (WitnessState::Unwitnessed, answer)
                }
            },
            Judgement::Unknown(answer) | Judgement::Silent(answer) => {
                (WitnessState::Waiting, answer)
            }
        }
    }

    /// Asks every witness about all of `known` at once (one call each), and weighs their
    /// answers per receipt: a contradiction outweighs an unknown transaction, which outweighs
    /// silence.
    async fn judge(
        &mut self,
        known: &[KnownTransfer],
        blocks: &HashMap<u64, String>,
    ) -> Vec<Judgement> {
        let mut heard: Vec<Heard> = known.iter().map(|_| Heard::default()).collect();
        let deadline = ANSWER_DEADLINE * u32::try_from(known.len()).unwrap_or(u32::MAX).max(1);
        for witness in &mut self.sources {
            let name = witness.source().to_string();
            let answers = match tokio::time::timeout(
                deadline,
                witness.attest(known, self.settle_depth),
            )
            .await
            {
                Ok(Ok(answers)) if answers.len() == known.len() => answers,
                Ok(Ok(_)) => {
                    let why = format!("the witness {name} answered for other receipts than asked");
                    heard.iter_mut().for_each(|h| h.silent.push(why.clone()));
                    continue;
                }
                Ok(Err(error)) => {
                    let why = format!("the witness {name} could not be asked: {error}");
                    heard.iter_mut().for_each(|h| h.silent.push(why.clone()));
                    continue;
                }
                Err(_) => {
                    let why = format!("the witness {name} did not answer within {deadline:?}");
                    heard.iter_mut().for_each(|h| h.silent.push(why.clone()));
                    continue;
                }
            };
            for ((known, attestation), heard) in known.iter().zip(answers).zip(&mut heard) {
                match attestation {
                    Attestation::Holds {
                        block,
                        confirmations,
                    } => {
                        if let Some(other) = other_block(known, block.as_ref(), blocks) {
                            heard
                                .contradicts
                                .push(format!("the witness {name} holds it {other}"));
                        } else if confirmations < self.credit_depth {
                            heard.silent.push(format!(
                                "the witness {name} holds it {confirmations} confirmations deep, {} needed",
                                self.credit_depth
                            ));
                        }
                    }
                    Attestation::Behind { head } => heard.silent.push(format!(
                        "the witness {name} is behind: its newest block is {head}"
                    )),
                    Attestation::Missing(why) => heard
                        .unknown
                        .push(format!("the witness {name} does not hold it: {why}")),
                    Attestation::Differs(what) => heard
                        .contradicts
                        .push(format!("the witness {name} holds it otherwise: {what}")),
                }
            }
        }
        heard.into_iter().map(Heard::judgement).collect()
    }
}

/// What the witnesses said of one receipt, by weight.
#[derive(Default)]
struct Heard {
    contradicts: Vec<String>,
    unknown: Vec<String>,
    silent: Vec<String>,
}

impl Heard {
    fn judgement(self) -> Judgement {
        if !self.contradicts.is_empty() {
            Judgement::Contradicts(self.contradicts.join("; "))
        } else if !self.unknown.is_empty() {
            Judgement::Unknown(self.unknown.join("; "))
        } else if !self.silent.is_empty() {
            Judgement::Silent(self.silent.join("; "))
        } else {
            Judgement::Holds
        }
    }
}

/// The batch's events the witnesses matter to: receipts of the shop's methods at the crediting
/// depth, and removals (a receipt a reorg took out is witnessed again if it comes back).
fn candidates(batch: &ScanBatch, credit_depth: u32) -> Vec<usize> {
    (0..batch.events.len())
        .filter(|i| match &batch.events[*i] {
            ChainEvent::Observed {
                transfer,
                confirmations,
                ..
            } => {
                *confirmations >= credit_depth
                    && matches!(transfer.asset, ReceivedAsset::Method { .. })
            }
            ChainEvent::Removed { .. } => true,
        })
        .collect()
}

/// Reports `event` one confirmation short of `credit_depth`: confirming, never credited.
fn hold(event: &mut ChainEvent, credit_depth: u32) {
    if let ChainEvent::Observed { confirmations, .. } = event {
        *confirmations = (*confirmations).min(credit_depth - 1);
    }
}

/// The hashes of the blocks the batch's cursor names, by height: the source's own blocks,
/// which a witness's must match.
fn block_hashes(batch: &ScanBatch) -> HashMap<u64, String> {
    batch
        .cursor
        .checkpoints
        .iter()
        .chain(std::iter::once(&batch.cursor.tip))
        .map(|b| (b.height, b.hash.clone()))
        .collect()
}

/// Where a witness's block differs from the source's: another height, or another hash at
/// the height where the source's cursor still names its block. `None` when they agree.
fn other_block(
    known: &KnownTransfer,
    block: Option<&BlockId>,
    source_blocks: &HashMap<u64, String>,
) -> Option<String> {
    let Some(block) = block else {
        return Some("unmined".to_owned());
    };
    if known.block_height != Some(block.height) {
        return Some(format!("in block {}", block.height));
    }
    match source_blocks.get(&block.height) {
        Some(hash) if *hash != block.hash => Some(format!(
            "in another block at height {}: {} where the source has {hash}",
            block.height, block.hash
        )),
        _ => None,
    }
}

/// What the source reported, for operators.
fn reported(known: &KnownTransfer, source: &str) -> String {
    let transfer = &known.transfer;
    let amount = match &transfer.asset {
        ReceivedAsset::Method { method } => method.format_with_asset(transfer.amount),
        other => format!("{} base units of {other}", transfer.amount),
    };
    let block = known
        .block_height
        .map_or_else(|| "unmined".to_owned(), |h| format!("in block {h}"));
    format!(
        "the source {source} reports {amount} to {} in transaction {} (position {}) {block}",
        transfer.to_address, transfer.id.txid, transfer.id.position
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use payrecon_chain_core::{Amount, Method, Transfer};

    fn known(block_height: Option<u64>) -> KnownTransfer {
        KnownTransfer {
            transfer: Transfer {
                id: TransferId {
                    network: Network::Tron,
                    txid: "ab".into(),
                    position: 0,
                },
                to_address: "Tshop".into(),
                asset: ReceivedAsset::Method {
                    method: Method::Trx,
                },
                amount: Amount::from(400_000_000u64),
                from_address: None,
            },
            confirmations: 19,
            block_height,
            tip_height: 30,
            seen_at_ms: 0,
        }
    }

    #[test]
    fn a_witness_block_must_be_the_sources() {
        let source = HashMap::from([(12, "0x12".to_owned())]);
        let at = |height: u64, hash: &str| BlockId {
            height,
            hash: hash.into(),
        };
        assert_eq!(
            other_block(&known(Some(12)), Some(&at(12, "0x12")), &source),
            None
        );
        // Where the source's cursor no longer names its block, the height must agree.
        assert_eq!(
            other_block(&known(Some(11)), Some(&at(11, "0x11")), &HashMap::new()),
            None
        );
        let moved = other_block(&known(Some(12)), Some(&at(13, "0x13")), &source).unwrap();
        assert_eq!(moved, "in block 13");
        let forked = other_block(&known(Some(12)), Some(&at(12, "0xff")), &source).unwrap();
        assert!(
            forked.contains("0xff where the source has 0x12"),
            "{forked}"
        );
        assert_eq!(
            other_block(&known(Some(12)), None, &source).unwrap(),
            "unmined"
        );
    }

    #[test]
    fn a_held_receipt_is_one_confirmation_short() {
        let known = known(Some(12));
        let mut event = ChainEvent::Observed {
            transfer: known.transfer.clone(),
            confirmations: 25,
            block_height: Some(12),
            seen_at_ms: 0,
            tip_height: 36,
        };
        hold(&mut event, 19);
        assert!(matches!(
            event,
            ChainEvent::Observed {
                confirmations: 18,
                ..
            }
        ));
        assert!(reported(&known, "http://node").contains("400 TRX to Tshop in transaction ab"));
    }
}
