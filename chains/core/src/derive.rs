//! Watch-only address derivation, shared by the chain crates.
//!
//! payrecon never holds a private key: every secp256k1 chain derives receive addresses from
//! an account-level extended public key (BIP32), non-hardened child `0/<index>`.

use std::str::FromStr;

use bitcoin::bip32::{ChildNumber, Xpub};
use bitcoin::secp256k1::{PublicKey, Secp256k1, VerifyOnly};

use crate::Network;

/// The version bytes of a mainnet `xpub`, which rust-bitcoin parses.
const XPUB_VERSION: [u8; 4] = [0x04, 0x88, 0xB2, 0x1E];
/// The version bytes of a testnet `tpub`.
const TPUB_VERSION: [u8; 4] = [0x04, 0x35, 0x87, 0xCF];

/// SLIP-132 and Litecoin prefixes that carry the same key material as `xpub` / `tpub`.
const MAINNET_ALIASES: [[u8; 4]; 4] = [
    [0x04, 0xB2, 0x47, 0x46], // zpub (BIP84)
    [0x04, 0x9D, 0x7C, 0xB2], // ypub (BIP49)
    [0x01, 0x9D, 0xA4, 0x62], // Ltub (Litecoin)
    [0x04, 0xB2, 0x43, 0x0C], // Zpub
];
const TESTNET_ALIASES: [[u8; 4]; 3] = [
    [0x04, 0x5F, 0x1C, 0xF6], // vpub (BIP84 testnet)
    [0x04, 0x4A, 0x52, 0x62], // upub (BIP49 testnet)
    [0x04, 0x36, 0xF6, 0xE1], // ttub (Litecoin testnet)
];

/// An account-level extended public key: the only key material payrecon is given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountXpub {
    xpub: Xpub,
    secp: Secp256k1<VerifyOnly>,
}

impl AccountXpub {
    /// The receive-chain public key at `index` (path `…/0/<index>` below the account).
    pub fn receive_key(&self, index: u32) -> Result<PublicKey, DeriveError> {
        let path = [
            ChildNumber::from_normal_idx(0).map_err(|_| DeriveError::Index(index))?,
            ChildNumber::from_normal_idx(index).map_err(|_| DeriveError::Index(index))?,
        ];
        self.xpub
            .derive_pub(&self.secp, &path)
            .map(|child| child.public_key)
            .map_err(|e| DeriveError::Derivation(e.to_string()))
    }

    /// A short, stable name for the key, so each key has its own derivation counter.
    pub fn fingerprint(&self) -> String {
        format!("{}", self.xpub.fingerprint())
    }
}

impl FromStr for AccountXpub {
    type Err = DeriveError;

    /// Accepts `xpub`/`tpub` and their SLIP-132 and Litecoin spellings (`zpub`, `vpub`,
    /// `Ltub`, …): rust-bitcoin parses only the first two, so the version is swapped first.
    fn from_str(text: &str) -> Result<AccountXpub, DeriveError> {
        let mut data = bitcoin::base58::decode_check(text.trim())
            .map_err(|_| DeriveError::InvalidXpub("not a base58check extended key"))?;
        if data.len() != 78 {
            return Err(DeriveError::InvalidXpub("wrong length for an extended key"));
        }
        let version: [u8; 4] = data[..4].try_into().expect("length checked");
        let canonical = if version == XPUB_VERSION || MAINNET_ALIASES.contains(&version) {
            XPUB_VERSION
        } else if version == TPUB_VERSION || TESTNET_ALIASES.contains(&version) {
            TPUB_VERSION
        } else {
            return Err(DeriveError::InvalidXpub(
                "not an extended public key (a private key, or an unknown prefix)",
            ));
        };
        data[..4].copy_from_slice(&canonical);
        let xpub = Xpub::decode(&data)
            .map_err(|_| DeriveError::InvalidXpub("malformed extended public key"))?;
        Ok(AccountXpub {
            xpub,
            secp: Secp256k1::verification_only(),
        })
    }
}

/// The 20-byte account id Ethereum and Tron both derive from a key: the last 20 bytes of
/// keccak256 of the uncompressed public key without its 0x04 prefix.
pub fn evm_account_bytes(key: &PublicKey) -> [u8; 20] {
    use sha3::{Digest, Keccak256};
    let uncompressed = key.serialize_uncompressed();
    let hash = Keccak256::digest(&uncompressed[1..]);
    hash[12..].try_into().expect("32-byte hash")
}

/// One freshly derived receive address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DerivedAddress {
    /// What the customer pays to; for Solana Pay the merchant recipient.
    pub address: String,
    /// What the watcher looks for: the address itself, or for Solana Pay the reference key.
    pub watch_key: String,
}

/// Turns a derivation index into a receive address for one network, from public keys only.
pub trait AddressDeriver: Send + Sync + std::fmt::Debug {
    /// The network whose addresses it makes.
    fn network(&self) -> Network;
    /// Names the key material, so that a new key starts its own index counter.
    fn key_id(&self) -> String;
    /// The address for `index`. Each index is used once; the engine reserves it.
    fn derive(&self, index: u32) -> Result<DerivedAddress, DeriveError>;
}

/// Why an address could not be derived.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeriveError {
    /// The configured key is not a usable extended public key.
    #[error("invalid extended public key: {0}")]
    InvalidXpub(&'static str),
    /// A hardened or out-of-range index.
    #[error("derivation index {0} is out of range")]
    Index(u32),
    /// The key library refused.
    #[error("derivation failed: {0}")]
    Derivation(String),
    /// Other configuration (recipient, network parameters) is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn any_text_is_an_xpub_or_refused(text in ".{0,120}|[1-9A-HJ-NP-Za-km-z]{100,120}") {
            let _ = text.parse::<AccountXpub>();
        }

        /// A mistyped key (one character changed) never parses as some other key.
        #[test]
        fn a_changed_character_is_refused(at in 0..111usize, to in "[1-9A-HJ-NP-Za-km-z]") {
            let key = crate::test_vectors::BIP84_ZPUB;
            let mut changed = key.to_owned();
            changed.replace_range(at..at + 1, &to);
            proptest::prop_assume!(changed != key);
            proptest::prop_assert!(changed.parse::<AccountXpub>().is_err());
        }
    }

    #[test]
    fn refuses_what_is_not_an_account_xpub() {
        assert!(matches!(
            "zpub-not-base58".parse::<AccountXpub>(),
            Err(DeriveError::InvalidXpub(_))
        ));
        // BIP32 test vector 1's master private key: a private key is refused, not used.
        let xprv = "xprv9s21ZrQH143K3QTDL4LXw2F7HEK3wJUD2nW2nRk4stbPy6cq3jPPqjiChkVvvNKmPGJxWUtg6LnF5kejMRNNU3TGtRBeJgk33yuGBxrMPHi";
        assert!(matches!(
            xprv.parse::<AccountXpub>(),
            Err(DeriveError::InvalidXpub(_))
        ));
    }
}
