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
    use payrecon_chain_core::test_vectors::abandon_account_xpub;

    fn account() -> AccountXpub {
        abandon_account_xpub("m/44'/195'/0'").parse().unwrap()
    }

    #[test]
    fn known_address_of_the_abandon_mnemonic() {
        assert_eq!(
            TronDeriver::new(account()).derive(0).unwrap().address,
            "TUEZSdKsoDHQMeZwihtdoBiN46zxhGWYdH"
        );
    }

    #[test]
    fn a_tron_address_carries_the_ethereum_account_bytes_of_its_key() {
        let key = account().receive_key(3).unwrap();
        let tron: TronAddress = TronDeriver::new(account())
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
