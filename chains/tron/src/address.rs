//! Tron addresses in their two spellings: base58check `T…` and hex `41…`. One type, one
//! conversion each way, used by the deriver and (later) the watcher alike.

use std::fmt;
use std::str::FromStr;

use payrecon_chain_core::bitcoin::base58;

/// The prefix byte of every Tron mainnet account address.
const TRON_PREFIX: u8 = 0x41;

/// A Tron account or contract address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TronAddress([u8; 20]);

impl TronAddress {
    /// The address of a 20-byte account id (keccak-derived, as on Ethereum).
    pub fn from_account_bytes(bytes: [u8; 20]) -> TronAddress {
        TronAddress(bytes)
    }

    /// The 20 account bytes, as an ABI address word ends with them.
    pub fn account_bytes(&self) -> &[u8; 20] {
        &self.0
    }

    /// The 21 bytes (`0x41` and the account) a transaction's protobuf carries.
    pub fn to_hex_bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(21);
        bytes.push(TRON_PREFIX);
        bytes.extend_from_slice(&self.0);
        bytes
    }

    /// The `41…` hex form the full-node API uses.
    pub fn to_hex(&self) -> String {
        let mut text = format!("{TRON_PREFIX:02x}");
        for byte in self.0 {
            text.push_str(&format!("{byte:02x}"));
        }
        text
    }

    /// Parses the `41…` hex form (42 hex digits).
    pub fn from_hex(text: &str) -> Result<TronAddress, TronAddressError> {
        let text = text.strip_prefix("0x").unwrap_or(text);
        if text.len() != 42 || !text.is_ascii() {
            return Err(TronAddressError::Malformed);
        }
        let bytes: Vec<u8> = (0..42)
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16))
            .collect::<Result<_, _>>()
            .map_err(|_| TronAddressError::Malformed)?;
        Self::from_prefixed(&bytes)
    }

    fn from_prefixed(bytes: &[u8]) -> Result<TronAddress, TronAddressError> {
        match bytes.split_first() {
            Some((&TRON_PREFIX, rest)) if rest.len() == 20 => {
                Ok(TronAddress(rest.try_into().expect("length checked")))
            }
            Some((&TRON_PREFIX, _)) => Err(TronAddressError::Malformed),
            _ => Err(TronAddressError::NotTron),
        }
    }
}

impl fmt::Display for TronAddress {
    /// The base58check `T…` form people and wallets use.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&base58::encode_check(&self.to_hex_bytes()))
    }
}

impl FromStr for TronAddress {
    type Err = TronAddressError;

    /// Parses the base58check `T…` form.
    fn from_str(text: &str) -> Result<TronAddress, TronAddressError> {
        let bytes = base58::decode_check(text).map_err(|_| TronAddressError::Malformed)?;
        Self::from_prefixed(&bytes)
    }
}

/// Why a string is not a Tron address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TronAddressError {
    /// Bad characters, length or checksum.
    #[error("not a valid Tron address")]
    Malformed,
    /// A valid encoding of something that is not a Tron address.
    #[error("not a Tron address (wrong prefix byte)")]
    NotTron,
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn any_text_parses_or_is_refused(text in ".{0,60}|[1-9A-HJ-NP-Za-km-z]{30,40}|(0x)?[0-9a-fA-F]{38,46}") {
            let _ = text.parse::<TronAddress>();
            let _ = TronAddress::from_hex(&text);
        }

        #[test]
        fn both_spellings_round_trip(bytes in proptest::prelude::any::<[u8; 20]>()) {
            let address = TronAddress::from_account_bytes(bytes);
            let base58 = address.to_string();
            proptest::prop_assert!(base58.starts_with('T'));
            proptest::prop_assert_eq!(base58.parse::<TronAddress>(), Ok(address));
            proptest::prop_assert_eq!(TronAddress::from_hex(&address.to_hex()), Ok(address));
        }

        #[test]
        fn a_changed_character_fails_the_checksum(bytes in proptest::prelude::any::<[u8; 20]>(), at in 1..34usize, to in "[1-9A-HJ-NP-Za-km-z]") {
            let text = TronAddress::from_account_bytes(bytes).to_string();
            let mut changed = text.clone();
            changed.replace_range(at..at + 1, &to);
            proptest::prop_assume!(changed != text);
            proptest::prop_assert!(changed.parse::<TronAddress>().is_err());
        }
    }

    #[test]
    fn usdt_contract_in_both_spellings() {
        let base58: TronAddress = "TR7NHqjeKQxGTCi8q8ZY4pL8otSzgjLj6t".parse().unwrap();
        assert_eq!(
            base58.to_hex(),
            "41a614f803b6fd780986a42c78ec9c7f77e6ded13c"
        );
        let hex = TronAddress::from_hex("41a614f803b6fd780986a42c78ec9c7f77e6ded13c").unwrap();
        assert_eq!(hex.to_string(), "TR7NHqjeKQxGTCi8q8ZY4pL8otSzgjLj6t");
    }

    #[test]
    fn refuses_other_strings() {
        assert_eq!(
            "TR7NHqjeKQxGTCi8q8ZY4pL8otSzgjLj6u".parse::<TronAddress>(),
            Err(TronAddressError::Malformed),
            "checksum"
        );
        assert_eq!(
            "1BoatSLRHtKNngkdXEeobR76b53LETtpyT".parse::<TronAddress>(),
            Err(TronAddressError::NotTron)
        );
        assert!(TronAddress::from_hex("41zz").is_err());
    }
}
