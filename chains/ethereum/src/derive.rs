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
    use payrecon_chain_core::test_vectors::abandon_account_xpub;

    fn deriver() -> EthereumDeriver {
        EthereumDeriver::new(abandon_account_xpub("m/44'/60'/0'").parse().unwrap())
    }

    #[test]
    fn known_address_of_the_abandon_mnemonic() {
        assert_eq!(
            deriver().derive(0).unwrap().address,
            "0x9858EfFD232B4033E47d90003D41EC34EcaEda94"
        );
    }

    #[test]
    fn addresses_are_eip55_checksummed_and_distinct() {
        let a = deriver().derive(1).unwrap().address;
        let b = deriver().derive(2).unwrap().address;
        assert_ne!(a, b);
        assert!(a.starts_with("0x") && a.len() == 42);
        assert_eq!(
            a.parse::<Address>().unwrap().to_checksum(None),
            a,
            "mixed-case checksum"
        );
    }
}
