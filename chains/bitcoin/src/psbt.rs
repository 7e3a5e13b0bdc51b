//! Refunds the merchant's own wallet signs: a PSBT (BIP 174) that spends the outputs a refund
//! takes its money from, pays the customer, and sends the change to the account's change
//! branch. payrecon holds no private key, so it only prepares: each input carries the output
//! it spends (`witness_utxo`, and the whole previous transaction where the source gave it, as
//! hardware wallets ask), and the key's BIP 32 path below the master key, so Sparrow,
//! Electrum, a hardware wallet or Bitcoin and Litecoin Core (`walletprocesspsbt`) find the key
//! that signs it.

use std::future::Future;

use payrecon_chain_core::bitcoin::bip32::{ChildNumber, DerivationPath, Fingerprint};
use payrecon_chain_core::bitcoin::psbt::Psbt;
use payrecon_chain_core::bitcoin::secp256k1::Secp256k1;
use payrecon_chain_core::bitcoin::{
    self, Amount, CompressedPublicKey, OutPoint, ScriptBuf, Sequence, Transaction, TxIn, TxOut,
    Witness, absolute::LockTime, transaction::Version,
};
use payrecon_chain_core::{AccountXpub, DeriveError, ScanError};

use crate::wallet::KeyOrigin;

/// Virtual bytes of a transaction's fixed part (version, counts, lock time, segwit marker).
const OVERHEAD_VBYTES: u64 = 11;
/// Virtual bytes of one P2WPKH input, its signature at its largest.
const P2WPKH_INPUT_VBYTES: u64 = 68;
/// An output below this pays more in fees to spend than it holds (P2WPKH at 3 sat/vB, as
/// Bitcoin Core's dust rule reckons): change this small goes to the fee instead.
const DUST_CHANGE: u64 = 294;

/// The blocks a refund's fee rate aims to be mined within.
pub(crate) const FEE_TARGET_BLOCKS: usize = 2;

/// A fee rate, in satoshi per virtual byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FeeRate {
    /// Satoshi (litoshi) per virtual byte, rounded up.
    pub sat_per_vbyte: u64,
    /// From the source's estimate; `false`: its relay floor, for want of one (a quiet
    /// chain, regtest).
    pub estimated: bool,
}

impl FeeRate {
    /// Bitcoin and Litecoin Core's default minimum relay fee (`-minrelaytxfee`, 1,000 per
    /// 1,000 virtual bytes): the rate when a source gives neither an estimate nor its floor.
    pub const DEFAULT_RELAY_FLOOR: FeeRate = FeeRate {
        sat_per_vbyte: 1,
        estimated: false,
    };

    /// A rate given in coins per 1,000 virtual bytes, as nodes and Electrum servers answer,
    /// rounded up to whole satoshi per byte (at least 1); `None` for no rate (`-1`, none).
    pub(crate) fn per_kvb_coins(coins: f64, estimated: bool) -> Option<FeeRate> {
        // Read through its eight-decimal text, so the rate is exact integer arithmetic after.
        let units = payrecon_chain_core::Amount::from_decimal_str(&format!("{coins:.8}"), 8)
            .ok()?
            .base_units();
        FeeRate::per_kvb(u64::try_from(units).ok()?, estimated)
    }

    /// A rate given in satoshi per 1,000 virtual bytes, rounded up; `None` for zero.
    pub(crate) fn per_kvb(units: u64, estimated: bool) -> Option<FeeRate> {
        (units > 0).then(|| FeeRate {
            sat_per_vbyte: units.div_ceil(1000).max(1),
            estimated,
        })
    }
}

/// What a Bitcoin-family source gives a refund the merchant's wallet signs.
pub trait RefundSource {
    /// The transactions `wanted` names, each with the block it is in (for a node without a
    /// transaction index), whole: the transactions whose outputs a refund spends.
    fn transactions(
        &mut self,
        wanted: &[(bitcoin::Txid, Option<u64>)],
    ) -> impl Future<Output = Result<Vec<Transaction>, ScanError>> + Send;

    /// The fee rate to be mined within [`FEE_TARGET_BLOCKS`] blocks, or the source's relay
    /// floor when it has no estimate.
    fn fee_rate(&mut self) -> impl Future<Output = Result<FeeRate, ScanError>> + Send;
}

/// One output the refund spends.
#[derive(Clone, Debug)]
pub struct RefundInput {
    /// The output.
    pub outpoint: OutPoint,
    /// What it holds, in satoshi (litoshi).
    pub value: u64,
    /// The receive index of the account key whose address it pays.
    pub receive_index: u32,
    /// The transaction that created it, when the source gave it.
    pub previous: Option<Transaction>,
}

/// What the refund is to do.
#[derive(Clone, Debug)]
pub struct RefundOrder {
    /// The outputs to spend, in order.
    pub inputs: Vec<RefundInput>,
    /// The customer's output script.
    pub pay_to: ScriptBuf,
    /// The refund's amount, in satoshi.
    pub amount: u64,
    /// The customer pays the fee: it is taken from `amount` rather than from the change.
    pub fee_from_amount: bool,
    /// The index on the account's change branch (`…/1/<index>`) the change goes to.
    pub change_index: u32,
    /// The fee rate, in satoshi per virtual byte.
    pub fee_rate: u64,
}

/// A prepared refund.
#[derive(Clone, Debug)]
pub struct PreparedRefund {
    /// What the merchant's wallet signs.
    pub psbt: Psbt,
    /// What the customer's output receives, in satoshi.
    pub pays: u64,
    /// The fee, in satoshi.
    pub fee: u64,
    /// The change output's script and value, when there is change above dust.
    pub change: Option<(ScriptBuf, u64)>,
    /// The signed transaction's size, at most, in virtual bytes.
    pub vsize: u64,
}

/// Builds the PSBT of `order`, spending outputs of `account` (whose place below the master
/// key is `origin`, when configured; else the account key's own fingerprint and the path
/// below it, which a wallet holding that account key matches). Refuses a refund the inputs
/// cannot pay with its fee, and one that would leave the customer dust.
pub fn refund_psbt(
    account: &AccountXpub,
    origin: Option<&KeyOrigin>,
    order: &RefundOrder,
) -> Result<PreparedRefund, DeriveError> {
    let refuse = |why: String| DeriveError::Config(why);
    if order.inputs.is_empty() {
        return Err(refuse("a refund spends at least one output".into()));
    }
    let held = order
        .inputs
        .iter()
        .try_fold(0u64, |sum, input| sum.checked_add(input.value))
        .ok_or_else(|| refuse("the outputs' values overflow".into()))?;
    let change_key = derive(account, &[1, order.change_index])?;
    let change_script = ScriptBuf::new_p2wpkh(&change_key.wpubkey_hash());
    let inputs_vbytes = P2WPKH_INPUT_VBYTES * order.inputs.len() as u64;
    let with_change = OVERHEAD_VBYTES
        + inputs_vbytes
        + output_vbytes(&order.pay_to)
        + output_vbytes(&change_script);
    let without_change = with_change - output_vbytes(&change_script);
    let fee_at = |vbytes: u64| order.fee_rate.saturating_mul(vbytes);
    let (pays, fee, change, vsize) = {
        let fee = fee_at(with_change);
        let pays = if order.fee_from_amount {
            order.amount.saturating_sub(fee)
        } else {
            order.amount
        };
        let spent = if order.fee_from_amount {
            order.amount
        } else {
            order.amount.saturating_add(fee)
        };
        match held.checked_sub(spent) {
            Some(change) if change >= DUST_CHANGE => (pays, fee, Some(change), with_change),
            _ => {
                // No change worth an output: what is left over goes to the fee.
                let fee = fee_at(without_change);
                let pays = if order.fee_from_amount {
                    order.amount.saturating_sub(fee)
                } else {
                    order.amount
                };
                let needed = pays.saturating_add(fee);
                if held < needed {
                    return Err(refuse(format!(
                        "the outputs hold {held} base units: {pays} to the customer and a fee of {fee} do not fit"
                    )));
                }
                (pays, held - pays, None, without_change)
            }
        }
    };
    if pays < DUST_CHANGE {
        return Err(refuse(format!(
            "the customer would receive {pays} base units after the fee, below what an output may hold"
        )));
    }
    let mut outputs = vec![TxOut {
        value: Amount::from_sat(pays),
        script_pubkey: order.pay_to.clone(),
    }];
    if let Some(change) = change {
        outputs.push(TxOut {
            value: Amount::from_sat(change),
            script_pubkey: change_script.clone(),
        });
    }
    let unsigned = Transaction {
        version: Version::TWO,
        lock_time: LockTime::ZERO,
        input: order
            .inputs
            .iter()
            .map(|input| TxIn {
                previous_output: input.outpoint,
                script_sig: ScriptBuf::new(),
                sequence: Sequence::ENABLE_RBF_NO_LOCKTIME,
                witness: Witness::new(),
            })
            .collect(),
        output: outputs,
    };
    let mut psbt =
        Psbt::from_unsigned_tx(unsigned).map_err(|e| refuse(format!("the PSBT: {e}")))?;
    let (fingerprint, base) = key_source(account, origin);
    for (slot, input) in psbt.inputs.iter_mut().zip(&order.inputs) {
        let key = derive(account, &[0, input.receive_index])?;
        slot.witness_utxo = Some(TxOut {
            value: Amount::from_sat(input.value),
            script_pubkey: ScriptBuf::new_p2wpkh(&key.wpubkey_hash()),
        });
        slot.non_witness_utxo = input.previous.clone();
        slot.bip32_derivation.insert(
            key.0,
            (fingerprint, path_below(&base, &[0, input.receive_index])),
        );
    }
    if change.is_some() {
        psbt.outputs[1].bip32_derivation.insert(
            change_key.0,
            (fingerprint, path_below(&base, &[1, order.change_index])),
        );
    }
    Ok(PreparedRefund {
        psbt,
        pays,
        fee,
        change: change.map(|value| (change_script, value)),
        vsize,
    })
}

/// The key at `path` (unhardened steps) below the account key.
fn derive(account: &AccountXpub, path: &[u32]) -> Result<CompressedPublicKey, DeriveError> {
    let secp = Secp256k1::verification_only();
    let steps = path
        .iter()
        .map(|&index| ChildNumber::from_normal_idx(index).map_err(|_| DeriveError::Index(index)))
        .collect::<Result<Vec<_>, _>>()?;
    let child = account
        .xpub()
        .derive_pub(&secp, &steps)
        .map_err(|e| DeriveError::Derivation(e.to_string()))?;
    Ok(CompressedPublicKey(child.public_key))
}

/// The fingerprint and path a wallet finds the account key by: the configured origin, else
/// the account key itself as the root.
fn key_source(account: &AccountXpub, origin: Option<&KeyOrigin>) -> (Fingerprint, DerivationPath) {
    match origin {
        Some(origin) => (origin.fingerprint, origin.path.clone()),
        None => (account.xpub().fingerprint(), DerivationPath::master()),
    }
}

fn path_below(base: &DerivationPath, steps: &[u32]) -> DerivationPath {
    let mut path: Vec<ChildNumber> = base.into_iter().copied().collect();
    path.extend(steps.iter().map(|&index| ChildNumber::Normal { index }));
    DerivationPath::from(path)
}

/// An output's size in virtual bytes: value, script length and script.
fn output_vbytes(script: &bitcoin::Script) -> u64 {
    9 + script.len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use payrecon_chain_core::bitcoin::Txid;
    use payrecon_chain_core::bitcoin::hashes::Hash;

    const TPUB: &str = "tpubDC8msFGeGuwnKG9Upg7DM2b4DaRqg3CUZa5g8v2SRQ6K4NSkxUgd7HsL2XVWbVm39yBA4LAxysQAm397zwQSQoQgewGiYZqrA9DsP4zbQ1M";

    fn order(values: &[u64], amount: u64, fee_from_amount: bool) -> RefundOrder {
        RefundOrder {
            inputs: values
                .iter()
                .enumerate()
                .map(|(i, &value)| RefundInput {
                    outpoint: OutPoint {
                        txid: Txid::from_byte_array([i as u8 + 1; 32]),
                        vout: i as u32,
                    },
                    value,
                    receive_index: i as u32 + 3,
                    previous: None,
                })
                .collect(),
            pay_to: ScriptBuf::new_p2wpkh(&bitcoin::WPubkeyHash::from_byte_array([9; 20])),
            amount,
            fee_from_amount,
            change_index: 7,
            fee_rate: 2,
        }
    }

    fn account() -> AccountXpub {
        TPUB.parse().unwrap()
    }

    #[test]
    fn fee_rates_round_up_to_whole_satoshi_per_byte() {
        let rate = |coins| FeeRate::per_kvb_coins(coins, true).map(|r| r.sat_per_vbyte);
        assert_eq!(rate(0.00001), Some(1));
        assert_eq!(rate(0.00012345), Some(13));
        assert_eq!(rate(0.000001), Some(1));
        assert_eq!(rate(-1.0), None);
        assert_eq!(rate(0.0), None);
    }

    #[test]
    fn the_shop_pays_the_fee_from_the_change() {
        let prepared =
            refund_psbt(&account(), None, &order(&[130_000_000], 30_000_000, false)).unwrap();
        let tx = &prepared.psbt.unsigned_tx;
        assert_eq!(prepared.pays, 30_000_000);
        assert_eq!(prepared.vsize, 11 + 68 + 31 + 31);
        assert_eq!(prepared.fee, 2 * prepared.vsize);
        assert_eq!(tx.output[0].value.to_sat(), 30_000_000);
        assert_eq!(
            tx.output[1].value.to_sat(),
            130_000_000 - 30_000_000 - prepared.fee
        );
        let spent: u64 = tx.output.iter().map(|o| o.value.to_sat()).sum();
        assert_eq!(spent + prepared.fee, 130_000_000);
    }

    #[test]
    fn the_customer_pays_the_fee_from_the_amount() {
        let prepared =
            refund_psbt(&account(), None, &order(&[130_000_000], 30_000_000, true)).unwrap();
        assert_eq!(prepared.pays, 30_000_000 - prepared.fee);
        assert_eq!(
            prepared.change.as_ref().unwrap().1,
            130_000_000 - 30_000_000
        );
    }

    #[test]
    fn change_below_dust_goes_to_the_fee() {
        let prepared = refund_psbt(&account(), None, &order(&[100_000], 99_600, false)).unwrap();
        assert!(prepared.change.is_none());
        assert_eq!(prepared.psbt.unsigned_tx.output.len(), 1);
        assert_eq!(prepared.pays + prepared.fee, 100_000);
    }

    #[test]
    fn a_refund_the_outputs_cannot_pay_is_refused() {
        let refused = refund_psbt(&account(), None, &order(&[100_000], 100_000, false));
        assert!(matches!(refused, Err(DeriveError::Config(why)) if why.contains("do not fit")));
        let dust = refund_psbt(&account(), None, &order(&[100_000], 400, true));
        assert!(matches!(dust, Err(DeriveError::Config(why)) if why.contains("below what")));
    }

    #[test]
    fn inputs_carry_their_output_and_key_path() {
        let origin: KeyOrigin = "[d34db33f/84h/2h/0h]".parse().unwrap();
        let prepared = refund_psbt(
            &account(),
            Some(&origin),
            &order(&[50_000_000, 80_000_000], 30_000_000, false),
        )
        .unwrap();
        for (i, input) in prepared.psbt.inputs.iter().enumerate() {
            let key = derive(&account(), &[0, i as u32 + 3]).unwrap();
            let utxo = input.witness_utxo.as_ref().unwrap();
            assert_eq!(
                utxo.script_pubkey,
                ScriptBuf::new_p2wpkh(&key.wpubkey_hash())
            );
            let (fingerprint, path) = &input.bip32_derivation[&key.0];
            assert_eq!(fingerprint.to_string(), "d34db33f");
            assert_eq!(path.to_string(), format!("84'/2'/0'/0/{}", i + 3));
        }
        let (_, change_path) = prepared.psbt.outputs[1]
            .bip32_derivation
            .values()
            .next()
            .unwrap();
        assert_eq!(change_path.to_string(), "84'/2'/0'/1/7");
        // What a signer reads back is what was written.
        let text = prepared.psbt.to_string();
        assert_eq!(text.parse::<Psbt>().unwrap(), prepared.psbt);
    }
}
