//! BIP44 `m/44'/60'/0'/0/<index>` addresses from an account xpub, EIP-55 checksummed.

use alloy_primitives::Address;
use payrecon_chain_core::{
    AccountXpub, AddressDeriver, DeriveError, DerivedAddress, Network, evm_account_bytes,
};

/// Derives Ethereum receive addresses. One address serves ETH, USDT and USDC alike, so each
/// intent gets its own: a token sent to an ETH intent is then visibly the wrong asset.
#[derive(Clone, Debug)]
pub struct EthereumDeriver {
    account: AccountXpub,
}

impl EthereumDeriver {
    /// A deriver below `account` (the xpub of `m/44'/60'/0'`).
    pub fn new(account: AccountXpub) -> EthereumDeriver {
        EthereumDeriver { account }
    }
}

impl AddressDeriver for EthereumDeriver {
    fn network(&self) -> Network {
        Network::Ethereum
    }

    fn key_id(&self) -> String {
        format!("eth:{}", self.account.fingerprint())
    }

    fn derive(&self, index: u32) -> Result<DerivedAddress, DeriveError> {
        let key = self.account.receive_key(index)?;
        let address = Address::from(evm_account_bytes(&key)).to_checksum(None);
        Ok(DerivedAddress {
            watch_key: address.clone(),
            address,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use payrecon_chain_core::bitcoin::bip32::{DerivationPath, Xpriv, Xpub};
    use payrecon_chain_core::bitcoin::secp256k1::Secp256k1;

    /// The BIP39 seed of "abandon abandon … about" with no passphrase (BIP39's own vectors);
    /// used only here, to make the account xpub a wallet would export.
    const SEED: &str = "5eb00bbddcf069084889a8ab9155568165f5c453ccb85e70811aaed6f6da5fc19a5ac40b389cd370d086206dec8aa6c43daea6690f20ad3d8d48b2d2ce9e38e4";

    fn account_xpub(path: &str) -> String {
        let secp = Secp256k1::new();
        let seed: Vec<u8> = (0..SEED.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&SEED[i..i + 2], 16).unwrap())
            .collect();
        let master =
            Xpriv::new_master(payrecon_chain_core::bitcoin::NetworkKind::Main, &seed).unwrap();
        let path: DerivationPath = path.parse().unwrap();
        let account = master.derive_priv(&secp, &path).unwrap();
        Xpub::from_priv(&secp, &account).to_string()
    }

    #[test]
    fn known_address_of_the_abandon_mnemonic() {
        let deriver = EthereumDeriver::new(account_xpub("m/44'/60'/0'").parse().unwrap());
        assert_eq!(
            deriver.derive(0).unwrap().address,
            "0x9858EfFD232B4033E47d90003D41EC34EcaEda94"
        );
    }

    #[test]
    fn the_seed_is_bip84s_own_vector() {
        // Cross-check of the seed above: its m/84'/0'/0' account is BIP84's published zpub.
        let bip84: AccountXpub = "zpub6rFR7y4Q2AijBEqTUquhVz398htDFrtymD9xYYfG1m4wAcvPhXNfE3EfH1r1ADqtfSdVCToUG868RvUUkgDKf31mGDtKsAYz2oz2AGutZYs".parse().unwrap();
        let derived: AccountXpub = account_xpub("m/84'/0'/0'").parse().unwrap();
        assert_eq!(
            bip84.receive_key(0).unwrap(),
            derived.receive_key(0).unwrap()
        );
    }

    #[test]
    fn addresses_are_eip55_checksummed_and_distinct() {
        let deriver = EthereumDeriver::new(account_xpub("m/44'/60'/0'").parse().unwrap());
        let a = deriver.derive(1).unwrap().address;
        let b = deriver.derive(2).unwrap().address;
        assert_ne!(a, b);
        assert!(a.starts_with("0x") && a.len() == 42);
        assert_eq!(
            a.parse::<Address>().unwrap().to_checksum(None),
            a,
            "mixed-case checksum"
        );
    }
}
