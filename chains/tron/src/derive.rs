//! BIP44 `m/44'/195'/0'/0/<index>` addresses from an account xpub.

use payrecon_chain_core::{
    AccountXpub, AddressDeriver, DeriveError, DerivedAddress, Network, evm_account_bytes,
};

use crate::TronAddress;

/// Derives Tron receive addresses: 0x41 and the keccak account id, in base58check.
#[derive(Clone, Debug)]
pub struct TronDeriver {
    account: AccountXpub,
}

impl TronDeriver {
    /// A deriver below `account` (the xpub of `m/44'/195'/0'`).
    pub fn new(account: AccountXpub) -> TronDeriver {
        TronDeriver { account }
    }
}

impl AddressDeriver for TronDeriver {
    fn network(&self) -> Network {
        Network::Tron
    }

    fn key_id(&self) -> String {
        format!("trx:{}", self.account.fingerprint())
    }

    fn derive(&self, index: u32) -> Result<DerivedAddress, DeriveError> {
        let key = self.account.receive_key(index)?;
        let address = TronAddress::from_account_bytes(evm_account_bytes(&key)).to_string();
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

    /// BIP39 seed of "abandon abandon … about" (see the Ethereum crate's cross-check).
    const SEED: &str = "5eb00bbddcf069084889a8ab9155568165f5c453ccb85e70811aaed6f6da5fc19a5ac40b389cd370d086206dec8aa6c43daea6690f20ad3d8d48b2d2ce9e38e4";

    fn account(path: &str) -> AccountXpub {
        let secp = Secp256k1::new();
        let seed: Vec<u8> = (0..SEED.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&SEED[i..i + 2], 16).unwrap())
            .collect();
        let master =
            Xpriv::new_master(payrecon_chain_core::bitcoin::NetworkKind::Main, &seed).unwrap();
        let path: DerivationPath = path.parse().unwrap();
        Xpub::from_priv(&secp, &master.derive_priv(&secp, &path).unwrap())
            .to_string()
            .parse()
            .unwrap()
    }

    #[test]
    fn known_address_of_the_abandon_mnemonic() {
        let deriver = TronDeriver::new(account("m/44'/195'/0'"));
        assert_eq!(
            deriver.derive(0).unwrap().address,
            "TUEZSdKsoDHQMeZwihtdoBiN46zxhGWYdH"
        );
    }

    #[test]
    fn a_tron_address_carries_the_ethereum_account_bytes_of_its_key() {
        let key = account("m/44'/195'/0'").receive_key(3).unwrap();
        let tron: TronAddress = TronDeriver::new(account("m/44'/195'/0'"))
            .derive(3)
            .unwrap()
            .address
            .parse()
            .unwrap();
        assert_eq!(
            tron,
            TronAddress::from_account_bytes(evm_account_bytes(&key))
        );
    }
}
