//! An unsigned EIP-1559 transaction from a payment address, for the merchant's wallet to sign:
//! a refund sent back from where the money sits. payrecon holds no key; it gives the fields
//! as JSON and the payload a signer signs (`0x02 || rlp([...])`, EIP-1559's signing form).

use alloy::consensus::{SignableTransaction as _, TxEip1559};
use alloy::primitives::{Address, Bytes, TxKind, U256, hex};
use alloy::providers::Provider;
use payrecon_chain_core::ScanError;
use serde::Serialize;

use crate::watch::{ETH_TRANSFER_GAS, EthereumScanner, TOKEN_TRANSFER_GAS, classify};

/// The selector of ERC-20 `transfer(address,uint256)`.
const TRANSFER_SELECTOR: [u8; 4] = [0xa9, 0x05, 0x9c, 0xbb];

/// What the node says an address's next transaction needs: its nonce, its ETH, and the fee
/// per gas to offer now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccountTerms {
    /// The next nonce, pending transactions counted.
    pub nonce: u64,
    /// Its ETH, in wei.
    pub balance: u128,
    /// The most per gas, in wei (twice the base fee, plus the tip).
    pub max_fee_per_gas: u128,
    /// The tip per gas, in wei.
    pub max_priority_fee_per_gas: u128,
}

/// An unsigned transaction, with what it costs at most and the ETH to send its address
/// first when it holds too little.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UnsignedTransaction {
    /// EIP-155 chain id.
    pub chain_id: u64,
    /// The address that signs it, EIP-55.
    pub from: String,
    /// Its nonce.
    pub nonce: u64,
    /// The recipient (ETH) or the token's contract, EIP-55.
    pub to: String,
    /// Wei sent along, decimal.
    pub value: String,
    /// Call data, `0x` hex (a token's `transfer`; empty for ETH).
    pub data: String,
    /// Gas it may use.
    pub gas_limit: u64,
    /// Wei per gas at most, decimal.
    pub max_fee_per_gas: String,
    /// Wei per gas to the block's producer, decimal.
    pub max_priority_fee_per_gas: String,
    /// What a signer signs the Keccak-256 of: `0x02 || rlp([chain_id, nonce, tip, max fee,
    /// gas, to, value, data, []])`, hex.
    pub unsigned_rlp: String,
    /// The most its fee can cost, in wei, decimal.
    pub max_fee: String,
    /// Wei to send to `from` before it can be sent (its fee, and for ETH its value, beyond
    /// what it holds); `0` when it holds enough.
    pub top_up_first: String,
}

/// What is sent: ETH to an address, or a token to an address through its contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sending {
    /// Wei to the recipient.
    Eth { to: Address, wei: u128 },
    /// Token units to the recipient, through `contract`.
    Token {
        contract: Address,
        to: Address,
        units: u128,
    },
}

impl EthereumScanner {
    /// The nonce, ETH and fees `from`'s next transaction needs, from the node.
    pub async fn account_terms(&mut self, from: Address) -> Result<AccountTerms, ScanError> {
        let provider = self.provider().await?;
        let nonce = provider
            .get_transaction_count(from)
            .pending()
            .await
            .map_err(classify)?;
        let balance = provider.get_balance(from).await.map_err(classify)?;
        let fees = provider.estimate_eip1559_fees().await.map_err(classify)?;
        Ok(AccountTerms {
            nonce,
            balance: u128::try_from(balance).unwrap_or(u128::MAX),
            max_fee_per_gas: fees.max_fee_per_gas,
            max_priority_fee_per_gas: fees.max_priority_fee_per_gas,
        })
    }
}

/// The unsigned EIP-1559 transaction of `sending` from `from` on `chain_id`, at `terms`.
pub fn unsigned_transfer(
    chain_id: u64,
    from: Address,
    terms: &AccountTerms,
    sending: Sending,
) -> UnsignedTransaction {
    let (to, value, input, gas_limit) = match sending {
        Sending::Eth { to, wei } => (to, wei, Vec::new(), ETH_TRANSFER_GAS),
        Sending::Token {
            contract,
            to,
            units,
        } => {
            let mut input = TRANSFER_SELECTOR.to_vec();
            input.extend_from_slice(to.into_word().as_slice());
            input.extend_from_slice(&U256::from(units).to_be_bytes::<32>());
            (contract, 0, input, TOKEN_TRANSFER_GAS)
        }
    };
    let tx = TxEip1559 {
        chain_id,
        nonce: terms.nonce,
        gas_limit,
        max_fee_per_gas: terms.max_fee_per_gas,
        max_priority_fee_per_gas: terms.max_priority_fee_per_gas,
        to: TxKind::Call(to),
        value: U256::from(value),
        access_list: Default::default(),
        input: Bytes::from(input),
    };
    let max_fee = terms.max_fee_per_gas.saturating_mul(u128::from(gas_limit));
    let needed = max_fee.saturating_add(value);
    UnsignedTransaction {
        chain_id,
        from: from.to_checksum(None),
        nonce: terms.nonce,
        to: to.to_checksum(None),
        value: value.to_string(),
        data: format!("0x{}", hex::encode(&tx.input)),
        gas_limit,
        max_fee_per_gas: terms.max_fee_per_gas.to_string(),
        max_priority_fee_per_gas: terms.max_priority_fee_per_gas.to_string(),
        unsigned_rlp: format!("0x{}", hex::encode(tx.encoded_for_signing())),
        max_fee: max_fee.to_string(),
        top_up_first: needed.saturating_sub(terms.balance).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_transfer_is_signed_as_eip_1559_says() {
        let terms = AccountTerms {
            nonce: 3,
            balance: 0,
            max_fee_per_gas: 2_000_000_000,
            max_priority_fee_per_gas: 1_000_000_000,
        };
        let to: Address = "0x52908400098527886E0F7030069857D2E4169EE7"
            .parse()
            .unwrap();
        let contract: Address = "0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48"
            .parse()
            .unwrap();
        let from: Address = "0x8617E340B3D01FA5F11F306F4090FD50E238070D"
            .parse()
            .unwrap();
        let unsigned = unsigned_transfer(
            1,
            from,
            &terms,
            Sending::Token {
                contract,
                to,
                units: 100_000_000,
            },
        );
        assert!(
            unsigned.unsigned_rlp.starts_with("0x02"),
            "{}",
            unsigned.unsigned_rlp
        );
        assert_eq!(
            unsigned.data,
            "0xa9059cbb00000000000000000000000052908400098527886e0f7030069857d2e4169ee70000000000000000000000000000000000000000000000000000000005f5e100"
        );
        assert_eq!(unsigned.max_fee, (2_000_000_000u128 * 65_000).to_string());
        assert_eq!(unsigned.top_up_first, unsigned.max_fee, "it holds no ETH");
        let eth = unsigned_transfer(
            1,
            from,
            &AccountTerms {
                balance: u128::MAX,
                ..terms
            },
            Sending::Eth { to, wei: 5 },
        );
        assert_eq!(
            (
                eth.value.as_str(),
                eth.data.as_str(),
                eth.gas_limit,
                eth.top_up_first.as_str()
            ),
            ("5", "0x", 21_000, "0")
        );
    }
}
