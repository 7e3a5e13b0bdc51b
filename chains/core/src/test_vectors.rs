//! Published key material for the chain crates' derivation tests: the BIP39 mnemonic
//! "abandon abandon … about", whose addresses wallets and specifications print as vectors.
//! Public on purpose: never send money to anything derived from it.

use bitcoin::bip32::{DerivationPath, Xpriv, Xpub};
use bitcoin::secp256k1::Secp256k1;

/// The BIP39 seed of "abandon ×11 about" with an empty passphrase (BIP39's vectors).
pub const ABANDON_SEED_HEX: &str = "5eb00bbddcf069084889a8ab9155568165f5c453ccb85e70811aaed6f6da5fc19a5ac40b389cd370d086206dec8aa6c43daea6690f20ad3d8d48b2d2ce9e38e4";

/// BIP84's own account key of that seed, m/84'/0'/0'.
pub const BIP84_ZPUB: &str = "zpub6rFR7y4Q2AijBEqTUquhVz398htDFrtymD9xYYfG1m4wAcvPhXNfE3EfH1r1ADqtfSdVCToUG868RvUUkgDKf31mGDtKsAYz2oz2AGutZYs";

/// The account xpub a wallet of that seed exports for `path` (e.g. `m/44'/60'/0'`).
pub fn abandon_account_xpub(path: &str) -> String {
    let secp = Secp256k1::new();
    let seed: Vec<u8> = (0..ABANDON_SEED_HEX.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&ABANDON_SEED_HEX[i..i + 2], 16).expect("hex"))
        .collect();
    let master = Xpriv::new_master(bitcoin::NetworkKind::Main, &seed).expect("seed");
    let path: DerivationPath = path.parse().expect("derivation path");
    Xpub::from_priv(
        &secp,
        &master.derive_priv(&secp, &path).expect("derivation"),
    )
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AccountXpub;

    #[test]
    fn the_seed_is_bip84s_own_vector() {
        let published: AccountXpub = BIP84_ZPUB.parse().unwrap();
        let derived: AccountXpub = abandon_account_xpub("m/84'/0'/0'").parse().unwrap();
        assert_eq!(
            published.receive_key(0).unwrap(),
            derived.receive_key(0).unwrap()
        );
    }
}
