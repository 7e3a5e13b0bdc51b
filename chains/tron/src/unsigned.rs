//! An unsigned Tron transaction from a payment address, for the merchant's wallet to sign: a
//! refund sent back from where the money sits. The node builds it (`createtransaction`,
//! `triggersmartcontract`), in the form TronWeb's `trx.sign` and TronLink take. payrecon reads
//! back the bytes a signer signs before it hands them on: a node that answered a transaction
//! paying someone else would otherwise have the merchant sign it.

use payrecon_chain_core::ScanError;
use payrecon_chain_core::bitcoin::hashes::{Hash as _, sha256};
use payrecon_chain_core::bitcoin::hex::{DisplayHex as _, FromHex as _};
use prost::Message as _;
use serde::Serialize;

use crate::TronAddress;
use crate::watch::{TRC20_TRANSFER_BYTES, TRC20_TRANSFER_ENERGY, TRX_TRANSFER_BYTES, TronScanner};

/// The selector of TRC-20 `transfer(address,uint256)`.
const TRANSFER_SELECTOR: [u8; 4] = [0xa9, 0x05, 0x9c, 0xbb];

/// `Transaction.Contract.ContractType` of a TRX transfer.
const TRANSFER_CONTRACT: i32 = 1;

/// `Transaction.Contract.ContractType` of a contract call.
const TRIGGER_SMART_CONTRACT: i32 = 31;

/// What is sent: TRX to an address, or a token to an address through its contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TronSending {
    /// Sun to the recipient.
    Trx { to: TronAddress, sun: u64 },
    /// Token units to the recipient, through `contract`.
    Token {
        contract: TronAddress,
        to: TronAddress,
        units: u128,
    },
}

/// An unsigned transaction as the node built it and payrecon checked it, with the TRX to send
/// its address first when it holds too little.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UnsignedTronTransaction {
    /// The node's transaction, unchanged (`txID`, `raw_data`, `raw_data_hex`): what TronWeb's
    /// `trx.sign` and TronLink take.
    pub transaction: serde_json::Value,
    /// Its id: the SHA-256 of `raw_data_hex`, which is what a signer signs.
    pub txid: String,
    /// The address that signs it, base58.
    pub from: String,
    /// When the network stops accepting it, Unix milliseconds (the node gives a minute or
    /// so): prepare again after that.
    pub expires_at_ms: i64,
    /// The most its energy may burn, in sun (token transfers; `0` for TRX).
    pub fee_limit: String,
    /// Sun to send to `from` before it can be sent (what its bandwidth and energy burn, and
    /// for TRX its value, beyond what it holds); `0` when it holds enough.
    pub top_up_first: String,
}

impl TronScanner {
    /// Has the node build the transaction sending `sending` from `from`, checks that its bytes
    /// do exactly that, and says what TRX `from` needs first at the committee's prices.
    pub async fn unsigned_transfer(
        &mut self,
        from: TronAddress,
        sending: TronSending,
    ) -> Result<UnsignedTronTransaction, ScanError> {
        let client = self.client()?;
        let fees = self.burn_prices().await?;
        let held = client.trx_balance(&from).await?;
        let (path, answer, fee_limit, needs) = match sending {
            TronSending::Trx { to, sun } => {
                let body = serde_json::json!({
                    "owner_address": from.to_hex(),
                    "to_address": to.to_hex(),
                    "amount": sun,
                });
                let answer = client.post("/wallet/createtransaction", body).await?;
                let burn = fees.bandwidth * u128::from(TRX_TRANSFER_BYTES);
                (
                    "/wallet/createtransaction",
                    answer,
                    0,
                    u128::from(sun) + burn,
                )
            }
            TronSending::Token {
                contract,
                to,
                units,
            } => {
                // At most twice a transfer's usual energy: a first transfer to a fresh holder
                // takes about that.
                let burn = fees.energy * u128::from(2 * TRC20_TRANSFER_ENERGY);
                let fee_limit = u64::try_from(burn)
                    .map_err(|_| ScanError::Fatal(format!("a fee limit of {burn} sun")))?;
                let body = serde_json::json!({
                    "owner_address": from.to_hex(),
                    "contract_address": contract.to_hex(),
                    "function_selector": "transfer(address,uint256)",
                    "parameter": transfer_arguments(&to, units).to_lower_hex_string(),
                    "fee_limit": fee_limit,
                    "call_value": 0,
                });
                let answer = client.post("/wallet/triggersmartcontract", body).await?;
                let answer = contract_call_transaction(answer)?;
                let needs = burn + fees.bandwidth * u128::from(TRC20_TRANSFER_BYTES);
                ("/wallet/triggersmartcontract", answer, fee_limit, needs)
            }
        };
        let raw_hex = answer["raw_data_hex"].as_str().unwrap_or_default();
        let txid = answer["txID"].as_str().unwrap_or_default();
        let checked = check_unsigned(raw_hex, txid, &from, &sending)
            .map_err(|why| ScanError::Fatal(format!("{path} answered {why}")))?;
        if checked.fee_limit != fee_limit {
            return Err(ScanError::Fatal(format!(
                "{path} answered a fee limit of {} sun, not the {fee_limit} asked for",
                checked.fee_limit
            )));
        }
        Ok(UnsignedTronTransaction {
            txid: txid.to_owned(),
            from: from.to_string(),
            expires_at_ms: checked.expiration,
            fee_limit: fee_limit.to_string(),
            top_up_first: needs.saturating_sub(held).to_string(),
            transaction: answer,
        })
    }
}

/// The committee's prices, sun per energy unit and per byte.
pub(crate) struct BurnPrices {
    pub(crate) energy: u128,
    pub(crate) bandwidth: u128,
}

/// `triggersmartcontract` answers `{"result": {"result": true}, "transaction": {…}}`, or a
/// result with a `code` and a hex `message` when the call cannot be built.
fn contract_call_transaction(answer: serde_json::Value) -> Result<serde_json::Value, ScanError> {
    if answer["result"]["result"].as_bool() == Some(true) {
        return Ok(answer["transaction"].clone());
    }
    let message = answer["result"]["message"].as_str().unwrap_or_default();
    // java-tron writes the message in hex; anything else is quoted as it came.
    let message = Vec::<u8>::from_hex(message).map_or_else(
        |_| message.to_owned(),
        |bytes| String::from_utf8_lossy(&bytes).into_owned(),
    );
    Err(ScanError::Fatal(format!(
        "/wallet/triggersmartcontract refused: {} {}",
        payrecon_chain_core::excerpt(answer["result"]["code"].as_str().unwrap_or("no code")),
        payrecon_chain_core::excerpt(&message)
    )))
}

/// `transfer(to, units)`'s arguments: two ABI words.
fn transfer_arguments(to: &TronAddress, units: u128) -> Vec<u8> {
    let mut arguments = vec![0; 64];
    arguments[12..32].copy_from_slice(to.account_bytes());
    arguments[48..64].copy_from_slice(&units.to_be_bytes());
    arguments
}

/// What a checked transaction's bytes say beyond what it sends.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct CheckedTransaction {
    pub(crate) expiration: i64,
    pub(crate) fee_limit: u64,
}

/// Checks that `raw_hex` (a `Transaction.raw`) is one contract sending exactly `sending` from
/// `from`, that `txid` is its hash, and that it carries nothing else: it must encode back to
/// the same bytes, so no field payrecon does not read (a memo, another permission) is signed.
pub(crate) fn check_unsigned(
    raw_hex: &str,
    txid: &str,
    from: &TronAddress,
    sending: &TronSending,
) -> Result<CheckedTransaction, String> {
    let bytes = Vec::<u8>::from_hex(raw_hex).map_err(|_| "a raw_data_hex that is not hex")?;
    let hash = sha256::Hash::hash(&bytes).to_string();
    if !hash.eq_ignore_ascii_case(txid) {
        return Err(format!(
            "txID {} for a transaction whose hash is {hash}",
            payrecon_chain_core::excerpt(txid)
        ));
    }
    let raw = proto::Raw::decode(bytes.as_slice())
        .map_err(|e| format!("a raw_data_hex that is no transaction: {e}"))?;
    if raw.encode_to_vec() != bytes {
        return Err("a transaction with fields payrecon does not read".into());
    }
    let [contract] = raw.contract.as_slice() else {
        return Err(format!(
            "{} contracts in one transaction",
            raw.contract.len()
        ));
    };
    let parameter = contract.parameter.clone().unwrap_or_default();
    let owner = from.to_hex_bytes();
    match sending {
        TronSending::Trx { to, sun } => {
            let transfer = proto::TransferContract::decode(parameter.value.as_slice())
                .ok()
                .filter(|_| contract.kind == TRANSFER_CONTRACT)
                .ok_or("a transaction that is no TRX transfer")?;
            let wanted = proto::TransferContract {
                owner_address: owner,
                to_address: to.to_hex_bytes(),
                amount: i64::try_from(*sun).map_err(|_| "an amount out of range")?,
            };
            if transfer != wanted || raw.fee_limit != 0 {
                return Err("a TRX transfer other than the one asked for".into());
            }
        }
        TronSending::Token {
            contract: token,
            to,
            units,
        } => {
            let call = proto::TriggerSmartContract::decode(parameter.value.as_slice())
                .ok()
                .filter(|_| contract.kind == TRIGGER_SMART_CONTRACT)
                .ok_or("a transaction that is no contract call")?;
            let mut data = TRANSFER_SELECTOR.to_vec();
            data.extend(transfer_arguments(to, *units));
            let wanted = proto::TriggerSmartContract {
                owner_address: owner,
                contract_address: token.to_hex_bytes(),
                call_value: 0,
                data,
            };
            if call != wanted {
                return Err("a contract call other than the token transfer asked for".into());
            }
        }
    }
    Ok(CheckedTransaction {
        expiration: raw.expiration,
        fee_limit: u64::try_from(raw.fee_limit).map_err(|_| "a negative fee limit")?,
    })
}

/// The part of java-tron's `Tron.proto` an unsigned transfer uses. `Raw` is what a signer
/// hashes; its fields keep their numbers from the protocol.
pub(crate) mod proto {
    /// `Transaction.raw`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Raw {
        #[prost(bytes = "vec", tag = "1")]
        pub(crate) ref_block_bytes: Vec<u8>,
        #[prost(bytes = "vec", tag = "4")]
        pub(crate) ref_block_hash: Vec<u8>,
        #[prost(int64, tag = "8")]
        pub(crate) expiration: i64,
        #[prost(message, repeated, tag = "11")]
        pub(crate) contract: Vec<Contract>,
        #[prost(int64, tag = "14")]
        pub(crate) timestamp: i64,
        #[prost(int64, tag = "18")]
        pub(crate) fee_limit: i64,
    }

    /// `Transaction.Contract`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Contract {
        #[prost(int32, tag = "1")]
        pub(crate) kind: i32,
        #[prost(message, optional, tag = "2")]
        pub(crate) parameter: Option<Any>,
    }

    /// `google.protobuf.Any`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Any {
        #[prost(string, tag = "1")]
        pub(crate) type_url: String,
        #[prost(bytes = "vec", tag = "2")]
        pub(crate) value: Vec<u8>,
    }

    /// `TransferContract`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct TransferContract {
        #[prost(bytes = "vec", tag = "1")]
        pub(crate) owner_address: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub(crate) to_address: Vec<u8>,
        #[prost(int64, tag = "3")]
        pub(crate) amount: i64,
    }

    /// `TriggerSmartContract`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct TriggerSmartContract {
        #[prost(bytes = "vec", tag = "1")]
        pub(crate) owner_address: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub(crate) contract_address: Vec<u8>,
        #[prost(int64, tag = "3")]
        pub(crate) call_value: i64,
        #[prost(bytes = "vec", tag = "4")]
        pub(crate) data: Vec<u8>,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded(fixture: &str, key: &str) -> serde_json::Value {
        serde_json::from_str::<serde_json::Value>(fixture).unwrap()[key].clone()
    }

    fn address(hex: &str) -> TronAddress {
        TronAddress::from_hex(hex).unwrap()
    }

    #[test]
    fn a_recorded_mainnet_trx_transfer_reads_as_what_it_sends() {
        let tx = recorded(
            include_str!(
                "../../../fixtures/tron/wallet_gettransactionbyid_transfercontract_mainnet.json"
            ),
            "response",
        );
        let from = address("41f460a8883003ad4996fe2aac1fce0e7136c8a3da");
        let sending = TronSending::Trx {
            to: address("412e6b0ee3b9f0bee175cd873ae8ca595092e92114"),
            sun: 6_265_363,
        };
        let (raw, txid) = (
            tx["raw_data_hex"].as_str().unwrap(),
            tx["txID"].as_str().unwrap(),
        );
        let checked = check_unsigned(raw, txid, &from, &sending).unwrap();
        assert_eq!(
            checked.expiration,
            tx["raw_data"]["expiration"].as_i64().unwrap()
        );
        assert_eq!(checked.fee_limit, 0);
        let more = TronSending::Trx {
            to: address("412e6b0ee3b9f0bee175cd873ae8ca595092e92114"),
            sun: 6_265_364,
        };
        assert!(check_unsigned(raw, txid, &from, &more).is_err());
        let elsewhere = TronSending::Trx {
            to: from,
            sun: 6_265_363,
        };
        assert!(check_unsigned(raw, txid, &from, &elsewhere).is_err());
    }

    #[test]
    fn a_recorded_mainnet_usdt_transfer_reads_as_what_it_sends() {
        let tx = recorded(
            include_str!("../../../fixtures/tron/usdt_transfer_transaction_raw_data_mainnet.json"),
            "transaction",
        );
        let from = address("41cf2e99409d2a9a9190197ab0bff35ca87818c41e");
        let usdt = address("41a614f803b6fd780986a42c78ec9c7f77e6ded13c");
        let to = address("415d4a41a3b0cdda5c03df72b38a20aa1b88777c75");
        let (raw, txid) = (
            tx["raw_data_hex"].as_str().unwrap(),
            tx["txID"].as_str().unwrap(),
        );
        // The recorded wallet wrote the address word with its 0x41 byte; payrecon asks for the
        // plain ABI word, so the recording reads as another call.
        let sending = TronSending::Token {
            contract: usdt,
            to,
            units: 4_191_000_000,
        };
        assert_eq!(
            check_unsigned(raw, txid, &from, &sending).unwrap_err(),
            "a contract call other than the token transfer asked for"
        );
        let bytes = Vec::<u8>::from_hex(raw).unwrap();
        let mut decoded = proto::Raw::decode(bytes.as_slice()).unwrap();
        assert_eq!(
            decoded.encode_to_vec(),
            bytes,
            "java-tron's encoding is prost's"
        );
        assert_eq!(decoded.fee_limit, 225_000_000);
        let any = decoded.contract[0].parameter.as_mut().unwrap();
        let mut call = proto::TriggerSmartContract::decode(any.value.as_slice()).unwrap();
        assert_eq!(call.data[..4], TRANSFER_SELECTOR);
        assert_eq!(call.data[4 + 12..4 + 32], *to.account_bytes());
        call.data[4 + 11] = 0;
        any.value = call.encode_to_vec();
        let plain = decoded.encode_to_vec();
        let plain_id = sha256::Hash::hash(&plain).to_string();
        let checked =
            check_unsigned(&plain.to_lower_hex_string(), &plain_id, &from, &sending).unwrap();
        assert_eq!(checked.fee_limit, 225_000_000);
        assert!(
            check_unsigned(&plain.to_lower_hex_string(), txid, &from, &sending)
                .unwrap_err()
                .starts_with("txID 4ad97d49")
        );
    }

    #[test]
    fn fields_payrecon_does_not_read_are_refused() {
        let tx = recorded(
            include_str!(
                "../../../fixtures/tron/wallet_gettransactionbyid_transfercontract_mainnet.json"
            ),
            "response",
        );
        let mut bytes = Vec::<u8>::from_hex(tx["raw_data_hex"].as_str().unwrap()).unwrap();
        // Field 10, `data` (a memo): "hi".
        bytes.extend([0x52, 0x02, b'h', b'i']);
        let id = sha256::Hash::hash(&bytes).to_string();
        let sending = TronSending::Trx {
            to: address("412e6b0ee3b9f0bee175cd873ae8ca595092e92114"),
            sun: 6_265_363,
        };
        let from = address("41f460a8883003ad4996fe2aac1fce0e7136c8a3da");
        assert_eq!(
            check_unsigned(&bytes.to_lower_hex_string(), &id, &from, &sending).unwrap_err(),
            "a transaction with fields payrecon does not read"
        );
    }

    #[test]
    fn a_refused_contract_call_says_why_in_words() {
        let answer = serde_json::json!({
            "result": {"code": "CONTRACT_VALIDATE_ERROR", "message": "6e6f20636f6e7472616374"}
        });
        assert_eq!(
            contract_call_transaction(answer).unwrap_err().to_string(),
            "refusing the chain data source: /wallet/triggersmartcontract refused: CONTRACT_VALIDATE_ERROR no contract"
        );
    }
}
