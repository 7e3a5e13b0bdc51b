//! Solana: SOL with Solana Pay transfer requests. One merchant recipient, a fresh random
//! reference key per intent, and the RPC watcher that finds payments to the recipient and
//! tells them apart by reference.

use std::str::FromStr;

mod sender;
#[cfg(feature = "testkit")]
pub mod testkit;
mod unsigned;
mod watch;

pub use unsigned::UnsignedSolanaTransfer;
pub use watch::{SolanaScanner, SolanaSettings};

use payrecon_chain_core::{AddressDeriver, DeriveError, DerivedAddress, Network};
use solana_pubkey::Pubkey;

/// `text` as the base58 public key it spells, or why it is none: how configured Solana
/// addresses are checked at start.
pub fn solana_address(text: &str) -> Result<String, DeriveError> {
    Pubkey::from_str(text)
        .map(|key| key.to_string())
        .map_err(|_| DeriveError::Config(format!("{text:?} is not a Solana public key")))
}

/// Makes Solana Pay payment targets: ed25519 has no public derivation, so instead of one
/// address per intent there is one recipient and one reference key per intent. The reference
/// is random public-key bytes with no secret anywhere; the customer's wallet adds it to the
/// transfer as a read-only account, which is how payrecon finds the payment.
#[derive(Clone, Debug)]
pub struct SolanaPayDeriver {
    recipient: Pubkey,
}

impl SolanaPayDeriver {
    /// A deriver paying to the merchant's `recipient` account (base58).
    pub fn new(recipient: &str) -> Result<SolanaPayDeriver, DeriveError> {
        let recipient = Pubkey::from_str(recipient).map_err(|_| {
            DeriveError::Config(format!(
                "Solana recipient {recipient:?} is not a public key"
            ))
        })?;
        Ok(SolanaPayDeriver { recipient })
    }
}

impl AddressDeriver for SolanaPayDeriver {
    fn network(&self) -> Network {
        Network::Solana
    }

    fn key_id(&self) -> String {
        format!("sol:{}", self.recipient)
    }

    /// The index is reserved like every other chain's, but the reference is random: 32 bytes
    /// from the operating system's generator make a collision impossible in practice, and the
    /// store's uniqueness constraint refuses one anyway.
    fn derive(&self, _index: u32) -> Result<DerivedAddress, DeriveError> {
        let reference = Pubkey::new_from_array(rand::random());
        Ok(DerivedAddress {
            address: self.recipient.to_string(),
            watch_key: reference.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RECIPIENT: &str = "9Wz2nTsvcEFo6LjvdQ5cY3D5e8jjSj5S8Sy8jqmLAvnR";

    #[test]
    fn one_recipient_and_a_fresh_reference_each_time() {
        let deriver = SolanaPayDeriver::new(RECIPIENT).unwrap();
        let a = deriver.derive(0).unwrap();
        let b = deriver.derive(1).unwrap();
        assert_eq!(a.address, RECIPIENT);
        assert_eq!(b.address, RECIPIENT);
        assert_ne!(a.watch_key, b.watch_key);
        let reference = Pubkey::from_str(&a.watch_key).unwrap();
        assert_eq!(reference.to_bytes().len(), 32);
    }

    #[test]
    fn refuses_a_recipient_that_is_not_a_key() {
        assert!(matches!(
            SolanaPayDeriver::new("not-a-key"),
            Err(DeriveError::Config(_))
        ));
    }
}
