//! An unsigned SOL transfer from the shop's recipient, for the merchant's wallet to sign: a
//! refund sent back from where the money sits. A legacy message with the System Program's
//! `transfer`, built by the Solana crates at the node's latest blockhash, in base64 both as
//! the message a signer signs and as the transaction with its signature left empty (what
//! Solana Pay transaction requests and wallet adapters deserialize).

use std::str::FromStr as _;

use payrecon_chain_core::ScanError;
use serde::Serialize;
use solana_commitment_config::CommitmentConfig;
use solana_message::Message;
use solana_pubkey::Pubkey;
use solana_transaction::Transaction;

use crate::watch::{SolanaScanner, classify};

/// An unsigned transfer, with what it costs and the SOL to send its payer first when it holds
/// too little.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UnsignedSolanaTransfer {
    /// The address that pays and signs it, base58.
    pub from: String,
    /// The recipient, base58.
    pub to: String,
    /// Lamports sent, decimal.
    pub lamports: String,
    /// The message a signer signs (ed25519 over these bytes), base64.
    pub message: String,
    /// The transaction with its one signature left empty, base64.
    pub transaction: String,
    /// The blockhash it is built on, base58.
    pub recent_blockhash: String,
    /// The last block height at which the network still takes it (a minute or two): prepare
    /// again after that.
    pub last_valid_block_height: u64,
    /// Its fee in lamports, as the node prices the message.
    pub fee: String,
    /// Lamports to send to `from` before it can be sent (the amount and the fee beyond what it
    /// holds); `0` when it holds enough.
    pub top_up_first: String,
}

impl SolanaScanner {
    /// The unsigned transfer of `lamports` from `from` to `to` at the node's latest
    /// finalized blockhash, its fee and what `from` needs first.
    pub async fn unsigned_transfer(
        &mut self,
        from: &str,
        to: &str,
        lamports: u64,
    ) -> Result<UnsignedSolanaTransfer, ScanError> {
        let key = |text: &str| {
            Pubkey::from_str(text)
                .map_err(|e| ScanError::Fatal(format!("{text:?} is not a Solana address: {e}")))
        };
        let (payer, recipient) = (key(from)?, key(to)?);
        let client = self.client()?;
        let (blockhash, last_valid_block_height) = client
            .get_latest_blockhash_with_commitment(CommitmentConfig::finalized())
            .await
            .map_err(|e| classify("getLatestBlockhash", e))?;
        let transfer = solana_system_interface::instruction::transfer(&payer, &recipient, lamports);
        let message = Message::new_with_blockhash(&[transfer], Some(&payer), &blockhash);
        let fee = client
            .get_fee_for_message(&message)
            .await
            .map_err(|e| classify("getFeeForMessage", e))?;
        let held = client
            .get_balance_with_commitment(&payer, CommitmentConfig::finalized())
            .await
            .map_err(|e| classify("getBalance", e))?
            .value;
        let message_bytes = message.serialize();
        let transaction = wincode::serialize(&Transaction::new_unsigned(message))
            .map_err(|e| ScanError::Fatal(format!("the unsigned transaction: {e}")))?;
        let needs = u128::from(lamports) + u128::from(fee);
        Ok(UnsignedSolanaTransfer {
            from: payer.to_string(),
            to: recipient.to_string(),
            lamports: lamports.to_string(),
            message: base64(&message_bytes),
            transaction: base64(&transaction),
            recent_blockhash: blockhash.to_string(),
            last_valid_block_height,
            fee: fee.to_string(),
            top_up_first: needs.saturating_sub(u128::from(held)).to_string(),
        })
    }
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transfer_message_is_the_documented_legacy_layout() {
        let (payer, recipient) = (
            Pubkey::new_from_array([1; 32]),
            Pubkey::new_from_array([2; 32]),
        );
        let blockhash = solana_message::Hash::new_from_array([3; 32]);
        let transfer = solana_system_interface::instruction::transfer(&payer, &recipient, 42);
        let message = Message::new_with_blockhash(&[transfer], Some(&payer), &blockhash);
        let bytes = message.serialize();
        // One signer (the payer), no read-only signer, one read-only account (the program).
        assert_eq!(bytes[..3], [1, 0, 1]);
        assert_eq!(bytes[3], 3, "three account keys");
        assert_eq!(bytes[4..36], [1; 32]);
        assert_eq!(bytes[36..68], [2; 32]);
        assert_eq!(bytes[68..100], [0; 32], "the System Program");
        assert_eq!(bytes[100..132], [3; 32]);
        // One instruction: program 2, accounts 0 and 1, `Transfer` (2) and 42 lamports.
        let mut instruction = vec![1, 2, 2, 0, 1, 12, 2, 0, 0, 0];
        instruction.extend(42u64.to_le_bytes());
        assert_eq!(bytes[132..], instruction);
        let transaction = wincode::serialize(&Transaction::new_unsigned(message)).unwrap();
        assert_eq!(transaction[0], 1, "one signature");
        assert_eq!(transaction[1..65], [0; 64], "left empty");
        assert_eq!(transaction[65..], bytes);
    }
}
