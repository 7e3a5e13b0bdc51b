//! Litecoin's MimbleWimble extension blocks (MWEB) in raw transactions.
//!
//! Since May 2022 Litecoin Core serializes a transaction that carries an MWEB part with a flag
//! byte that has bit `0x08` set after the segwit marker (`primitives/transaction.h`,
//! `SerializeTransaction`):
//!
//! ```text
//! version:4  0x00  flags  inputs  outputs  [witnesses if flags & 0x01]  [MWEB if flags & 0x08]  lock_time:4
//! ```
//!
//! The MWEB part is an optional pointer: `0x00` for none (every block's HogEx, the integrating
//! transaction whose outputs are the block's peg-outs), `0x01` and the MWEB transaction
//! otherwise (a peg-in while it waits in the mempool). rust-bitcoin refuses any flag but
//! `0x01`. payrecon never hands out an MWEB address, so what it must read is the canonical
//! part only: the inputs and outputs, which is all the transaction id hashes (Litecoin Core
//! hashes without witness and without MWEB). The MWEB part is skipped whole, unparsed, the way
//! BitGo's utxo-lib drops it when it reserializes: the lock time is the last four bytes, and
//! whatever lies between the witnesses and it is the MWEB part. The caller still checks that
//! the canonical part hashes to the transaction id it asked for, so nothing skipped can change
//! what is read.
//!
//! A transaction with an MWEB part and neither inputs nor outputs is MWEB-only (a payment
//! inside MWEB, or a peg-out before its block): nothing of it is visible on an ordinary
//! address, and its id is MWEB's own hash, so it is reported as such and not read.

use payrecon_chain_core::Network;
use payrecon_chain_core::bitcoin::consensus::{self, Decodable};
use payrecon_chain_core::bitcoin::locktime::absolute::LockTime;
use payrecon_chain_core::bitcoin::transaction::Version;
use payrecon_chain_core::bitcoin::{Script, Transaction, TxIn, TxOut, Witness};

/// How deep a peg-out must be before Litecoin Core lets it be spent: its wallet reports one
/// `immature` at 1 to 5 confirmations and `trusted` from 6 (seen with 0.21.2.1 on regtest), as
/// coinbase outputs are held for 100. payrecon counts a peg-out no confirmations before.
pub(crate) const PEGOUT_MATURITY: u32 = 6;

/// Whether a transaction on `network` whose first output pays `first_output` carries peg-outs:
/// a Litecoin HogEx, whose outputs after the first count no confirmations until they mature.
pub(crate) fn carries_pegouts(network: Network, first_output: Option<&Script>) -> bool {
    network == Network::Litecoin && first_output.is_some_and(is_hogex)
}

/// Whether a transaction whose first output pays `script` is a HogEx: the integrating
/// transaction's first output pays the HogAddr, `OP_8 <32-byte MWEB header hash>`, and its
/// others are the block's peg-outs.
fn is_hogex(first_output: &Script) -> bool {
    matches!(first_output.as_bytes(), [0x58, 0x20, rest @ ..] if rest.len() == 32)
}

/// The flag bit of a transaction with witnesses.
const FLAG_WITNESS: u8 = 0x01;
/// The flag bit of a transaction with an MWEB part.
const FLAG_MWEB: u8 = 0x08;

/// What a Litecoin raw transaction holds for payrecon.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decoded {
    /// Its canonical part, with any MWEB part left out: what hashes to its id.
    Canonical(Transaction),
    /// MWEB only: no ordinary input or output.
    MwebOnly,
}

/// Why raw bytes are not a Litecoin transaction.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DecodeError {
    #[error(transparent)]
    Consensus(#[from] consensus::encode::Error),
    #[error("unknown transaction flags {0:#04x}")]
    Flags(u8),
    #[error("the MWEB part is malformed ({0})")]
    Mweb(&'static str),
}

/// Decodes a Bitcoin or Litecoin raw transaction, MWEB's forms included.
pub(crate) fn decode(raw: &[u8]) -> Result<Decoded, DecodeError> {
    match raw {
        [_, _, _, _, 0x00, flags, ..] if flags & FLAG_MWEB != 0 => decode_extended(raw, *flags),
        _ => Ok(Decoded::Canonical(consensus::deserialize(raw)?)),
    }
}

fn decode_extended(raw: &[u8], flags: u8) -> Result<Decoded, DecodeError> {
    if flags & !(FLAG_WITNESS | FLAG_MWEB) != 0 {
        return Err(DecodeError::Flags(flags));
    }
    let (version, rest) = raw.split_at(4);
    let version = i32::from_le_bytes(version.try_into().expect("four bytes"));
    let mut reader = &rest[2..];
    let mut input = Vec::<TxIn>::consensus_decode(&mut reader)?;
    let output = Vec::<TxOut>::consensus_decode(&mut reader)?;
    if flags & FLAG_WITNESS != 0 {
        for txin in &mut input {
            txin.witness = Witness::consensus_decode(&mut reader)?;
        }
    }
    let Some((mweb, lock_time)) = reader.split_last_chunk::<4>() else {
        return Err(DecodeError::Mweb("no lock time after it"));
    };
    let present = match mweb {
        [0x00] => false,
        [0x01, _, ..] => true,
        [] => return Err(DecodeError::Mweb("missing")),
        _ => return Err(DecodeError::Mweb("neither absent nor present")),
    };
    if input.is_empty() && output.is_empty() {
        return if present {
            Ok(Decoded::MwebOnly)
        } else {
            Err(DecodeError::Mweb("nothing but an empty MWEB part"))
        };
    }
    Ok(Decoded::Canonical(Transaction {
        version: Version(version),
        lock_time: LockTime::from_consensus(u32::from_le_bytes(*lock_time)),
        input,
        output,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use payrecon_chain_core::bitcoin::Txid;
    use payrecon_chain_core::bitcoin::hex::FromHex;
    use proptest::prelude::*;

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/../../fixtures/litecoin/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        Vec::from_hex(text.trim()).expect("hex")
    }

    fn canonical(raw: &[u8]) -> Transaction {
        match decode(raw).expect("decodes") {
            Decoded::Canonical(tx) => tx,
            Decoded::MwebOnly => panic!("has a canonical part"),
        }
    }

    fn txid(text: &str) -> Txid {
        text.parse().unwrap()
    }

    #[test]
    fn a_mainnet_hogex_decodes_to_the_id_explorers_show() {
        let tx = canonical(&fixture("hogex_mainnet_2383207.hex"));
        assert_eq!(
            tx.compute_txid(),
            txid("62d73befab5f48db9841aea938e57c8054dfdc284d6a60fc7d3363662aa078e6")
        );
        assert_eq!(tx.output.len(), 1);
        assert_eq!(tx.output[0].value.to_sat(), 793_199_220_526);
        assert_eq!(
            tx.output[0].script_pubkey.as_bytes()[0],
            0x58,
            "OP_8: the HogAddr"
        );
    }

    #[test]
    fn a_hogex_carrying_a_peg_out_reads_its_output() {
        let tx = canonical(&fixture("hogex_pegout_regtest.hex"));
        assert_eq!(
            tx.compute_txid(),
            txid("8dcb51c8b6753d488a8f581082a62788eb63e6be7071d085d3c074a336657b39")
        );
        let pegout = &tx.output[1];
        assert_eq!(pegout.value.to_sat(), 125_000_000);
        assert_eq!(
            crate::spends::address_of(&pegout.script_pubkey, "rltc").as_deref(),
            Some("rltc1q284dkl0t0mnv46e4nns6c7v26zvvenmcmgmvpj")
        );
    }

    #[test]
    fn a_peg_in_with_witnesses_and_an_mweb_body_keeps_its_id() {
        let raw = fixture("pegin_mempool_regtest.hex");
        assert_eq!(raw[5], 0x09);
        let tx = canonical(&raw);
        assert_eq!(
            tx.compute_txid(),
            txid("52a4aa4feee18096d20f1d218512bfbfe24f74fa3d12721ae496e6bd88eca2e0")
        );
        assert_eq!(tx.input[0].witness.len(), 2, "the witnesses are read");
        assert_eq!(tx.output.len(), 1);
        assert_eq!(tx.output[0].value.to_sat(), 299_998_370);
        assert_eq!(
            tx.output[0].script_pubkey.as_bytes()[0],
            0x59,
            "OP_9: a peg-in"
        );
    }

    #[test]
    fn an_mweb_only_transaction_has_nothing_canonical() {
        assert_eq!(
            decode(&fixture("pegout_mweb_only_mempool_regtest.hex")).unwrap(),
            Decoded::MwebOnly
        );
    }

    #[test]
    fn unknown_flags_and_broken_mweb_parts_are_refused() {
        let mut raw = fixture("hogex_mainnet_2383207.hex");
        raw[5] = 0x0a;
        assert!(matches!(decode(&raw), Err(DecodeError::Flags(0x0a))));
        let mut raw = fixture("hogex_mainnet_2383207.hex");
        let at = raw.len() - 5;
        raw[at] = 0x02;
        assert!(matches!(decode(&raw), Err(DecodeError::Mweb(_))));
        let raw = fixture("hogex_mainnet_2383207.hex");
        assert!(
            decode(&raw[..raw.len() - 5]).is_err(),
            "cut before the lock time"
        );
    }

    #[test]
    fn ordinary_transactions_still_decode() {
        // The peg-in as the node serves it once mined: flag 0x01, no MWEB part.
        let tx = canonical(&fixture("pegin_mempool_regtest.hex"));
        let raw = consensus::serialize(&tx);
        assert_eq!(raw[5], 0x01);
        assert_eq!(canonical(&raw), tx);
    }

    proptest! {
        /// Mutated MWEB transactions never panic, and a mutation that still hashes to the
        /// original id reads exactly the original outputs: nothing skipped changes an amount.
        #[test]
        fn mutations_never_panic_nor_misread(
            which in 0usize..3,
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
            cut in any::<prop::sample::Index>(),
            truncate in any::<bool>(),
        ) {
            let name = ["hogex_mainnet_2383207.hex", "hogex_pegout_regtest.hex", "pegin_mempool_regtest.hex"][which];
            let original = canonical(&fixture(name));
            let mut raw = fixture(name);
            for (at, byte) in edits {
                let at = at.index(raw.len());
                raw[at] = byte;
            }
            if truncate {
                raw.truncate(cut.index(raw.len()));
            }
            if let Ok(Decoded::Canonical(tx)) = decode(&raw)
                && tx.compute_txid() == original.compute_txid()
            {
                prop_assert_eq!(tx.output, original.output);
            }
        }
    }
}
