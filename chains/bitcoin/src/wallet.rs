//! What the merchant's wallet needs to find every payment: BIP-380 output descriptors of the
//! account payrecon derives from, receive and change branch, with key origin and checksum.
//!
//! payrecon hands out one receive index per payment intent and most intents are never paid, so
//! the wallet also needs a gap limit wide enough to step over the unpaid runs; the engine
//! works that out from its records. The descriptors are built and checksummed by the
//! `miniscript` crate, the implementation BDK and Sparrow's tooling rely on.

use std::str::FromStr;

use miniscript::Descriptor;
use miniscript::descriptor::{DescriptorPublicKey, DescriptorXKey, Wildcard};
use payrecon_chain_core::bitcoin::NetworkKind;
use payrecon_chain_core::bitcoin::bip32::{ChildNumber, DerivationPath, Fingerprint};
use payrecon_chain_core::{AccountXpub, DeriveError};

use crate::UtxoNetwork;

/// Where the account key sits below the wallet's master key: `[fingerprint/84h/2h/0h]`.
/// Hardware wallets and Sparrow need it to sign; a watch-only import works without.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyOrigin {
    /// The master key's fingerprint (the first 4 bytes of its HASH160).
    pub fingerprint: Fingerprint,
    /// The hardened path from the master key to the account key.
    pub path: DerivationPath,
}

impl FromStr for KeyOrigin {
    type Err = DeriveError;

    /// `[d34db33f/84h/0h/0h]` (`'` or `h` for hardened; the brackets are optional).
    fn from_str(text: &str) -> Result<KeyOrigin, DeriveError> {
        let invalid = |why: &str| {
            DeriveError::Config(format!(
                "key origin {text:?}: {why}; expected [fingerprint/84h/coin h/account h], e.g. [d34db33f/84h/0h/0h]"
            ))
        };
        let inner = text.trim().trim_start_matches('[').trim_end_matches(']');
        let (fingerprint, path) = inner
            .split_once('/')
            .ok_or_else(|| invalid("no path after the fingerprint"))?;
        let fingerprint = Fingerprint::from_str(fingerprint)
            .map_err(|_| invalid("the fingerprint is not 8 hex digits"))?;
        let path = DerivationPath::from_str(&format!("m/{path}"))
            .map_err(|_| invalid("the path does not parse"))?;
        if path.is_empty() {
            return Err(invalid("the path is empty"));
        }
        Ok(KeyOrigin { fingerprint, path })
    }
}

/// The account's two descriptors, each with its `#checksum`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalletDescriptors {
    /// `wpkh([origin]xpub/0/*)#…`: where payrecon's payment addresses are.
    pub receive: String,
    /// `wpkh([origin]xpub/1/*)#…`: where the wallet puts its change when it spends them.
    pub change: String,
}

/// The descriptors of `account` on `network`. The key is written with the version bytes
/// Bitcoin Core and Litecoin Core expect there (`xpub` on mainnet, `tpub` elsewhere; both
/// use Bitcoin's), whatever spelling (`zpub`, `Ltub`, …) was configured. An origin whose
/// depth differs from the key's is refused: it cannot be this key's.
pub fn descriptors(
    account: &AccountXpub,
    network: UtxoNetwork,
    origin: Option<&KeyOrigin>,
) -> Result<WalletDescriptors, DeriveError> {
    let mut xpub = *account.xpub();
    xpub.network = match network {
        UtxoNetwork::Mainnet => NetworkKind::Main,
        UtxoNetwork::Testnet | UtxoNetwork::Regtest => NetworkKind::Test,
    };
    if let Some(origin) = origin {
        if origin.path.len() != usize::from(xpub.depth) {
            return Err(DeriveError::Config(format!(
                "key origin {}: the path is {} steps long but the key sits {} below its master",
                origin_text(origin),
                origin.path.len(),
                xpub.depth
            )));
        }
        if origin.path.as_ref().last() != Some(&xpub.child_number) {
            return Err(DeriveError::Config(format!(
                "key origin {}: its last step is not the key's own ({})",
                origin_text(origin),
                xpub.child_number
            )));
        }
    }
    let branch = |index: u32| -> Result<String, DeriveError> {
        let key = DescriptorPublicKey::XPub(DescriptorXKey {
            origin: origin.map(|o| (o.fingerprint, o.path.clone())),
            xkey: xpub,
            derivation_path: vec![
                ChildNumber::from_normal_idx(index).expect("0 and 1 are normal indexes"),
            ]
            .into(),
            wildcard: Wildcard::Unhardened,
        });
        let descriptor: Descriptor<DescriptorPublicKey> =
            Descriptor::new_wpkh(key).map_err(|e| DeriveError::Derivation(e.to_string()))?;
        Ok(descriptor.to_string())
    };
    Ok(WalletDescriptors {
        receive: branch(0)?,
        change: branch(1)?,
    })
}

/// `[fingerprint/84h/2h/0h]`, the way descriptors write an origin.
pub fn origin_text(origin: &KeyOrigin) -> String {
    let path = origin.path.to_string();
    let path = path.trim_start_matches("m/").replace('\'', "h");
    format!("[{}/{path}]", origin.fingerprint)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// BIP-84's own account key of the mnemonic "abandon … about" (m/84'/0'/0').
    const BIP84_ACCOUNT: &str = "zpub6rFR7y4Q2AijBEqTUquhVz398htDFrtymD9xYYfG1m4wAcvPhXNfE3EfH1r1ADqtfSdVCToUG868RvUUkgDKf31mGDtKsAYz2oz2AGutZYs";

    #[test]
    fn bip84_account_descriptors_carry_origin_and_checksum() {
        let account: AccountXpub = BIP84_ACCOUNT.parse().unwrap();
        let origin: KeyOrigin = "[73c5da0a/84h/0h/0h]".parse().unwrap();
        let wallet = descriptors(&account, UtxoNetwork::Mainnet, Some(&origin)).unwrap();
        // Checksums as Bitcoin Core's getdescriptorinfo computes them for these descriptors.
        assert_eq!(
            wallet.receive,
            "wpkh([73c5da0a/84'/0'/0']xpub6CatWdiZiodmUeTDp8LT5or8nmbKNcuyvz7WyksVFkKB4RHwCD3XyuvPEbvqAQY3rAPshWcMLoP2fMFMKHPJ4ZeZXYVUhLv1VMrjPC7PW6V/0/*)#wc3n3van"
        );
        assert!(wallet.change.contains("/1/*)#"));
    }

    #[test]
    fn a_testnet_wallet_gets_a_tpub_and_no_origin_without_one() {
        let account: AccountXpub = BIP84_ACCOUNT.parse().unwrap();
        let wallet = descriptors(&account, UtxoNetwork::Regtest, None).unwrap();
        assert!(
            wallet.receive.starts_with("wpkh(tpub"),
            "{}",
            wallet.receive
        );
    }

    #[test]
    fn an_origin_that_cannot_be_the_keys_is_refused() {
        let account: AccountXpub = BIP84_ACCOUNT.parse().unwrap();
        for origin in ["[73c5da0a/84h/0h]", "[73c5da0a/84h/0h/1h]"] {
            let origin: KeyOrigin = origin.parse().unwrap();
            assert!(descriptors(&account, UtxoNetwork::Mainnet, Some(&origin)).is_err());
        }
        for text in ["73c5da0a", "[zz/84h]", "[73c5da0a/]", "[73c5da0a/84x]"] {
            assert!(text.parse::<KeyOrigin>().is_err(), "{text}");
        }
        assert_eq!(
            origin_text(&"[73C5DA0A/84'/0'/0']".parse().unwrap()),
            "[73c5da0a/84h/0h/0h]"
        );
    }
}
