//! The java-tron full-node HTTP API (also served by TronGrid): the few calls the watcher
//! makes, the shapes of their answers, and retries.
//!
//! Addresses come as hex `41…` (the API's default, `visible=false`); log addresses and topics
//! as bare hex. Amounts of TRX are JSON integers in sun; token values are uint256 hex words.

use std::time::Duration;

use payrecon_chain_core::http::{build_client, client_builder, read_text};
use payrecon_chain_core::{Attempt, RetryPolicy, ScanError, SecretUrl};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::TronAddress;

/// A block as `/wallet/getblockbynum` and `/wallet/getnowblock` return it.
#[derive(Clone, Debug, Deserialize)]
pub struct Block {
    /// The block hash.
    #[serde(rename = "blockID")]
    pub block_id: String,
    /// Header fields.
    pub block_header: BlockHeader,
    /// Absent for a block without transactions.
    #[serde(default)]
    pub transactions: Vec<Transaction>,
}

/// `block_header`.
#[derive(Clone, Debug, Deserialize)]
pub struct BlockHeader {
    /// `raw_data`.
    pub raw_data: BlockRawData,
}

/// `block_header.raw_data`. The genesis block has no parent and no number.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockRawData {
    /// Height; omitted (0) for the genesis block.
    #[serde(default)]
    pub number: u64,
    /// The parent's `blockID`.
    #[serde(default)]
    pub parent_hash: String,
    /// Unix milliseconds.
    #[serde(default)]
    pub timestamp: i64,
}

/// A transaction inside a block.
#[derive(Clone, Debug, Deserialize)]
pub struct Transaction {
    /// The transaction id.
    #[serde(rename = "txID")]
    pub tx_id: String,
    /// `[{"contractRet": "SUCCESS"}]` when it succeeded.
    #[serde(default)]
    pub ret: Vec<TransactionRet>,
    /// What it does.
    pub raw_data: TransactionRawData,
}

impl Transaction {
    /// `contractRet` is `SUCCESS` (a reverted or out-of-energy call is still in the block).
    pub fn succeeded(&self) -> bool {
        self.ret
            .first()
            .and_then(|r| r.contract_ret.as_deref())
            .is_some_and(|r| r == "SUCCESS")
    }
}

/// One `ret` entry.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TransactionRet {
    /// `SUCCESS`, `REVERT`, `OUT_OF_ENERGY`, …
    pub contract_ret: Option<String>,
}

/// `raw_data` of a transaction.
#[derive(Clone, Debug, Deserialize)]
pub struct TransactionRawData {
    /// Exactly one contract in practice.
    #[serde(default)]
    pub contract: Vec<Contract>,
}

/// A contract call of a transaction: `type` and its `parameter.value`.
#[derive(Clone, Debug, Deserialize)]
pub struct Contract {
    /// `TransferContract`, `TriggerSmartContract`, `TransferAssetContract`, …
    #[serde(rename = "type")]
    pub kind: String,
    /// `parameter`.
    pub parameter: ContractParameter,
}

/// `parameter` of a contract.
#[derive(Clone, Debug, Deserialize)]
pub struct ContractParameter {
    /// The fields of the contract type; only transfers are decoded.
    pub value: serde_json::Value,
}

/// The account that signed a contract: `parameter.value.owner_address` of every contract type.
#[derive(Clone, Debug, Deserialize)]
pub struct OwnerValue {
    /// The signer, hex `41…`.
    pub owner_address: String,
}

/// `parameter.value` of `TransferContract` (TRX) and `TransferAssetContract` (TRC-10).
#[derive(Clone, Debug, Deserialize)]
pub struct TransferValue {
    /// Sun for TRX, token units for TRC-10.
    pub amount: u64,
    /// The sender, hex `41…`.
    pub owner_address: String,
    /// The recipient, hex `41…`.
    pub to_address: String,
    /// The TRC-10 token id (hex of its name), only on `TransferAssetContract`.
    #[serde(default)]
    pub asset_name: Option<String>,
}

/// One element of `/wallet/gettransactioninfobyblocknum`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TransactionInfo {
    /// The transaction id.
    pub id: String,
    /// Sun the transaction burned for its bandwidth and energy (absent when it burned none,
    /// its resources staked or free).
    #[serde(default)]
    pub fee: u64,
    /// Its block.
    #[serde(default)]
    pub block_number: u64,
    /// `"FAILED"` on failure, absent on success.
    #[serde(default)]
    pub result: Option<String>,
    /// The execution receipt.
    #[serde(default)]
    pub receipt: Receipt,
    /// Event logs, absent when none.
    #[serde(default)]
    pub log: Vec<EventLog>,
    /// The calls the transaction's contracts made, in execution order, absent when none.
    #[serde(default, rename = "internal_transactions")]
    pub internal_transactions: Vec<InternalTransaction>,
}

/// One call a contract made inside a transaction (`internal_transactions[]`).
#[derive(Clone, Debug, Deserialize)]
pub struct InternalTransaction {
    /// The calling contract, hex `41…`.
    pub caller_address: String,
    /// The called address, which receives the value, hex `41…`.
    #[serde(rename = "transferTo_address")]
    pub transfer_to_address: String,
    /// What the call carried: `{}` for nothing, `{callValue}` for TRX, `{callValue, tokenId}`
    /// for a TRC-10 token.
    #[serde(default, rename = "callValueInfo")]
    pub call_value_info: Vec<CallValue>,
    /// Present and true when the call's effects were undone (it, or a call above it, failed).
    #[serde(default)]
    pub rejected: bool,
}

/// One value an internal call carried.
#[derive(Clone, Debug, Deserialize)]
pub struct CallValue {
    /// Sun, or TRC-10 units with `token_id`; absent for a call that carried nothing.
    #[serde(default, rename = "callValue")]
    pub call_value: Option<u64>,
    /// The TRC-10 token's id; absent for TRX.
    #[serde(default, rename = "tokenId")]
    pub token_id: Option<String>,
}

impl TransactionInfo {
    /// The contract call ran to its end: receipt `SUCCESS` and no `FAILED` result.
    pub fn succeeded(&self) -> bool {
        self.result.as_deref() != Some("FAILED")
            && self.receipt.result.as_deref() == Some("SUCCESS")
    }
}

/// `receipt` of a transaction info.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Receipt {
    /// `SUCCESS`, `REVERT`, `OUT_OF_ENERGY`, …; absent for plain TRX transfers.
    #[serde(default)]
    pub result: Option<String>,
}

/// `/wallet/getchainparameters`: the network's prices as the committee set them.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChainParameters {
    /// Key and value pairs.
    #[serde(default)]
    pub chain_parameter: Vec<ChainParameter>,
}

impl ChainParameters {
    /// The value of `key`, if the node lists it.
    pub fn get(&self, key: &str) -> Option<i64> {
        self.chain_parameter
            .iter()
            .find(|p| p.key == key)
            .map(|p| p.value)
    }
}

/// One chain parameter.
#[derive(Clone, Debug, Deserialize)]
pub struct ChainParameter {
    /// `getEnergyFee`, `getTransactionFee`, …
    pub key: String,
    /// Its value.
    #[serde(default)]
    pub value: i64,
}

/// One event log: the emitting contract as 20 bytes of hex (no `41`), topics and data as
/// bare hex.
#[derive(Clone, Debug, Deserialize)]
pub struct EventLog {
    /// The emitting contract, 40 hex digits.
    pub address: String,
    /// Topic words, 64 hex digits each.
    #[serde(default)]
    pub topics: Vec<String>,
    /// Non-indexed data.
    #[serde(default)]
    pub data: String,
}

/// A full node (or TronGrid) over HTTP, with retries.
#[derive(Clone)]
pub struct TronClient {
    http: reqwest::Client,
    base: SecretUrl,
    api_key: Option<String>,
    max_answer_bytes: usize,
}

impl std::fmt::Debug for TronClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TronClient")
            .field("base", &self.base)
            .field("api_key", &self.api_key.as_ref().map(|_| "***"))
            .finish()
    }
}

impl TronClient {
    /// A client for the node at `base` (`https://api.trongrid.io` or your own node), sending
    /// `TRON-PRO-API-KEY` when given.
    pub fn new(
        base: &SecretUrl,
        api_key: Option<String>,
        timeout: Duration,
        max_answer_bytes: usize,
    ) -> Result<TronClient, ScanError> {
        let http = build_client(client_builder(timeout))?;
        Ok(TronClient {
            http,
            base: SecretUrl::new(base.expose().trim_end_matches('/')),
            api_key,
            max_answer_bytes,
        })
    }

    /// `/wallet/getnowblock` or, with `solidified`, `/walletsolidity/getnowblock`.
    pub async fn now_block(&self, solidified: bool) -> Result<Block, ScanError> {
        let path = if solidified {
            "/walletsolidity/getnowblock"
        } else {
            "/wallet/getnowblock"
        };
        self.post::<Option<Block>>(path, serde_json::json!({}))
            .await?
            .ok_or_else(|| ScanError::Transient(format!("{path} has no block yet")))
    }

    /// `/wallet/getblockbynum`; `None` for a block the node does not have yet (`{}`).
    pub async fn block(&self, height: u64) -> Result<Option<Block>, ScanError> {
        let block: Option<Block> = self
            .post(
                "/wallet/getblockbynum",
                serde_json::json!({ "num": height }),
            )
            .await?;
        match block {
            Some(block) if block.block_header.raw_data.number != height => {
                Err(ScanError::Transient(format!(
                    "asked for block {height}, got block {}",
                    block.block_header.raw_data.number
                )))
            }
            block => Ok(block),
        }
    }

    /// `/wallet/gettransactioninfobyblocknum`: the execution results of a block's
    /// transactions.
    pub async fn transaction_infos(&self, height: u64) -> Result<Vec<TransactionInfo>, ScanError> {
        // An empty block answers `[]`; block 0 answers `{}`.
        let infos: Option<Vec<TransactionInfo>> = self
            .post(
                "/wallet/gettransactioninfobyblocknum",
                serde_json::json!({ "num": height }),
            )
            .await?;
        Ok(infos.unwrap_or_default())
    }

    /// `/wallet/gettransactioninfobyid`: one transaction's execution result and block, or
    /// `None` for one the node does not know (`{}`).
    pub async fn transaction_info(&self, txid: &str) -> Result<Option<TransactionInfo>, ScanError> {
        let answer: serde_json::Value = self
            .post(
                "/wallet/gettransactioninfobyid",
                serde_json::json!({ "value": txid }),
            )
            .await?;
        if answer.as_object().is_some_and(serde_json::Map::is_empty) {
            return Ok(None);
        }
        serde_json::from_value(answer)
            .map(Some)
            .map_err(|e| ScanError::Fatal(format!("gettransactioninfobyid {txid}: {e}")))
    }

    /// `/wallet/getcontract`: the smart contract deployed at `address` (its name), or `None`
    /// when there is none (`{}`).
    pub async fn contract_name(&self, address: &str) -> Result<Option<String>, ScanError> {
        #[derive(serde::Deserialize)]
        struct Contract {
            #[serde(default)]
            name: String,
            #[serde(default)]
            bytecode: String,
        }
        let contract: Option<Contract> = self
            .post(
                "/wallet/getcontract",
                serde_json::json!({ "value": address, "visible": true }),
            )
            .await?;
        Ok(contract.filter(|c| !c.bytecode.is_empty()).map(|c| c.name))
    }

    /// `/wallet/getchainparameters`: the energy and bandwidth prices among the rest.
    pub async fn chain_parameters(&self) -> Result<ChainParameters, ScanError> {
        let parameters: Option<ChainParameters> = self
            .post("/wallet/getchainparameters", serde_json::json!({}))
            .await?;
        parameters.ok_or_else(|| ScanError::Fatal("the node lists no chain parameters".into()))
    }

    /// `/wallet/getaccount`: the account's TRX in sun; `0` for one the chain has never seen
    /// (`{}`), and java-tron leaves a zero balance out.
    pub async fn trx_balance(&self, address: &TronAddress) -> Result<u128, ScanError> {
        #[derive(serde::Deserialize)]
        struct Account {
            #[serde(default)]
            balance: u128,
        }
        let account: Option<Account> = self
            .post(
                "/wallet/getaccount",
                serde_json::json!({ "address": address.to_hex() }),
            )
            .await?;
        Ok(account.map_or(0, |a| a.balance))
    }

    /// POSTs `body` to `path` and decodes the answer; `{}` reads as `null`.
    pub(crate) async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: serde_json::Value,
    ) -> Result<T, ScanError> {
        let text = self.post_text(path, body).await?;
        // java-tron answers `{}` for "nothing there" (no such block, no infos of block 0).
        if text.trim() == "{}" {
            return decode(path, "null");
        }
        decode(path, &text)
    }

    /// POSTs `body` and returns the answer's text, retrying what may pass: connection
    /// failures, timeouts, 429 and 5xx, bodies cut short.
    async fn post_text(&self, path: &str, body: serde_json::Value) -> Result<String, ScanError> {
        RetryPolicy::default()
            .run(path, || self.attempt(path, &body))
            .await
    }

    async fn attempt(&self, path: &str, body: &serde_json::Value) -> Result<String, Attempt> {
        let mut request = self
            .http
            .post(format!("{}{path}", self.base.expose()))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(key) = &self.api_key {
            request = request.header("TRON-PRO-API-KEY", key);
        }
        let response = request.send().await.map_err(|e| Attempt::Retry {
            reason: self.base.scrub(&format!("{path}: {}", e.without_url())),
            after: None,
        })?;
        let status = response.status();
        let after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        // Too large is retried like a cut answer: a node does not answer gigabytes, something
        // between us and it does, and the watcher says so while it waits.
        let text = read_text(response, self.max_answer_bytes)
            .await
            .map_err(|e| Attempt::Retry {
                reason: format!("{path}: {e}"),
                after: None,
            })?;
        let excerpt = payrecon_chain_core::excerpt(&text);
        if status.as_u16() == 429 || status.as_u16() == 403 || status.is_server_error() {
            // TronGrid says "rate limited" with 429, 403 (no key) or 503 (over quota).
            return Err(Attempt::Retry {
                reason: format!("{path}: HTTP {status}: {excerpt}"),
                after,
            });
        }
        if !status.is_success() {
            return Err(Attempt::Fatal(format!(
                "{path} answered HTTP {status}: {excerpt}"
            )));
        }
        if text.trim_start().starts_with("{\"Error\"") {
            // java-tron's own failures (`{"Error": "<exception> : <message>"}`) are the node's
            // trouble, not an answer.
            return Err(Attempt::Retry {
                reason: format!("{path}: the node failed: {excerpt}"),
                after: None,
            });
        }
        // A body that ends mid-JSON was cut short on the way: ask again.
        if let Err(error) = serde_json::from_str::<serde::de::IgnoredAny>(&text)
            && error.is_eof()
        {
            return Err(Attempt::Retry {
                reason: format!("{path}: the answer was cut short: {error}"),
                after: None,
            });
        }
        Ok(text)
    }
}

/// A complete answer that does not have the documented shape cannot be trusted: the watcher
/// stops rather than skip what it could not read.
pub(crate) fn decode<T: DeserializeOwned>(path: &str, text: &str) -> Result<T, ScanError> {
    serde_json::from_str(text)
        .map_err(|e| ScanError::Fatal(payrecon_chain_core::malformed(path, &e, text)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded<T: DeserializeOwned>(fixture: &str, key: &str) -> T {
        let envelope: serde_json::Value = serde_json::from_str(fixture).unwrap();
        serde_json::from_value(envelope[key].clone()).unwrap()
    }

    #[test]
    fn the_recorded_responses_decode_as_the_watcher_reads_them() {
        let block: Block = recorded(
            include_str!("../../../fixtures/tron/wallet_getblockbynum_with_transfercontract.json"),
            "response",
        );
        assert_eq!(block.block_header.raw_data.number, 24_902_354);
        assert!(block.block_id.starts_with("00000000017bfad2"));
        let tx = &block.transactions[0];
        assert!(tx.succeeded());
        assert_eq!(tx.raw_data.contract[0].kind, "TransferContract");
        let value: TransferValue =
            serde_json::from_value(tx.raw_data.contract[0].parameter.value.clone()).unwrap();
        assert_eq!(
            (value.amount, value.to_address.as_str()),
            (1_000_000_000, "4108a8954b7862d07cf4ce6ac78c3a83d72bd917e4")
        );

        let now: Block = recorded(
            include_str!("../../../fixtures/tron/wallet_getnowblock.json"),
            "response",
        );
        assert!(now.transactions.is_empty());

        let usdt: TransactionInfo = recorded(
            include_str!(
                "../../../fixtures/tron/wallet_gettransactioninfobyid_usdt_transfer_mainnet.json"
            ),
            "response",
        );
        assert!(usdt.succeeded());
        assert_eq!(
            usdt.log[0].address,
            "a614f803b6fd780986a42c78ec9c7f77e6ded13c"
        );

        let reverted: TransactionInfo = recorded(
            include_str!("../../../fixtures/tron/wallet_gettransactioninfobyid_revert.json"),
            "raw_http_fragment_usdt",
        );
        assert!(!reverted.succeeded());
        assert!(reverted.log.is_empty());

        let trx: Vec<TransactionInfo> = recorded(
            include_str!("../../../fixtures/tron/wallet_gettransactioninfobyblocknum_nile.json"),
            "response",
        );
        assert_eq!(trx.len(), 2);
        assert!(
            trx.iter()
                .all(|info| info.log.is_empty() && info.block_number == 66_987_565)
        );
        assert_eq!(trx[0].fee, 267_000, "a TRX transfer's burned bandwidth");
        let parameters: ChainParameters = recorded(
            include_str!("../../../fixtures/tron/wallet_getchainparameters.json"),
            "response",
        );
        assert_eq!(parameters.get("getEnergyFee"), Some(210));
        assert_eq!(parameters.get("getTransactionFee"), Some(1000));
        assert_eq!(parameters.get("getNoSuchThing"), None);
    }
}
