//! A fake Solana JSON-RPC node for tests and benchmarks: no validator runs here, so the
//! answers to `getSignaturesForAddress`, `getTransaction` (jsonParsed), `getSignatureStatuses`,
//! `getSlot` and `getBlockHeight` are built from the documented responses recorded in
//! `fixtures/solana/`, and the real Solana RPC client talks to it. `getLatestBlockhash`,
//! `getFeeForMessage` and `getBalance` answer in their documented shapes (a context and a
//! value): a blockhash per slot, 5,000 lamports per signature, and what the node's transfers
//! left at an address. Like a real node it refuses
//! `processed` commitment on the two history methods. Scenarios: pay (with or without a
//! reference, to the recipient or elsewhere, failing), finalize, drop a confirmed transaction
//! with its fork, and queue faults (HTTP 429, answers slower than the client's timeout).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use solana_pubkey::Pubkey;

const SIGNATURES: &str = include_str!("../../../fixtures/solana/getSignaturesForAddress.json");
const TRANSACTION: &str = include_str!(
    "../../../fixtures/solana/getTransaction_jsonParsed_solana_pay_reference_SYNTHETIC.json"
);
const STATUSES: &str = include_str!("../../../fixtures/solana/getSignatureStatuses.json");

fn recorded(fixture: &str) -> Value {
    serde_json::from_str(fixture).expect("fixture is JSON")
}

/// A transaction's fate so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Commitment {
    Confirmed,
    Finalized,
    Dropped,
}

#[derive(Clone, Debug)]
struct Tx {
    signature: String,
    slot: u64,
    block_time: i64,
    payer: String,
    to: String,
    lamports: u64,
    reference: Option<String>,
    failed: bool,
    commitment: Commitment,
}

impl Tx {
    fn keys(&self) -> Vec<&str> {
        let mut keys = vec![self.payer.as_str(), self.to.as_str()];
        keys.push("11111111111111111111111111111111");
        if let Some(reference) = &self.reference {
            keys.push(reference);
        }
        keys
    }
}

/// What the node answers instead of the truth, once.
#[derive(Clone, Debug)]
pub enum Fault {
    /// HTTP 429 Too Many Requests.
    TooManyRequests,
    /// The true answer, this late (longer than the client's timeout: a timeout).
    Slow(Duration),
}

struct Node {
    slot: u64,
    txs: Vec<Tx>,
    faults: VecDeque<Fault>,
    /// The signature listings answer as a node behind the others: nothing past this slot.
    listings_behind: Option<u64>,
}

/// A running fake node.
#[derive(Clone)]
pub struct FakeSolana {
    /// Its JSON-RPC URL.
    pub url: String,
    node: Arc<Mutex<Node>>,
}

/// A random public key, base58: a payer, a reference, another merchant.
pub fn random_pubkey() -> String {
    Pubkey::new_from_array(rand::random()).to_string()
}

impl FakeSolana {
    /// A node at slot 1000 serving on a free local port.
    pub async fn start() -> FakeSolana {
        let node = Arc::new(Mutex::new(Node {
            slot: 1000,
            txs: Vec::new(),
            faults: VecDeque::new(),
            listings_behind: None,
        }));
        let app = Router::new()
            .route("/", axum::routing::post(answer))
            .with_state(node.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a local port");
        let url = format!("http://{}", listener.local_addr().expect("bound"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        FakeSolana { url, node }
    }

    /// A transfer of `lamports` to `to` carrying `reference`, confirmed in the next slot at
    /// `block_time` (Unix seconds); `failed` makes it fail (it stays on the chain, its fee
    /// paid, nothing moved). Returns its signature.
    pub fn pay(
        &self,
        to: &str,
        lamports: u64,
        reference: Option<&str>,
        block_time: i64,
        failed: bool,
    ) -> String {
        self.transfer(
            &random_pubkey(),
            to,
            lamports,
            reference,
            block_time,
            failed,
        )
    }

    /// A transfer `payer` signs (and pays the fee of): the merchant moving money out of its
    /// recipient. Returns its signature.
    pub fn send_from(
        &self,
        payer: &str,
        to: &str,
        lamports: u64,
        block_time: i64,
        failed: bool,
    ) -> String {
        self.transfer(payer, to, lamports, None, block_time, failed)
    }

    fn transfer(
        &self,
        payer: &str,
        to: &str,
        lamports: u64,
        reference: Option<&str>,
        block_time: i64,
        failed: bool,
    ) -> String {
        let mut node = self.node.lock().expect("node");
        node.slot += 1;
        let signature = solana_signature_text();
        let tx = Tx {
            signature: signature.clone(),
            slot: node.slot,
            block_time,
            payer: payer.to_owned(),
            to: to.to_owned(),
            lamports,
            reference: reference.map(str::to_owned),
            failed,
            commitment: Commitment::Confirmed,
        };
        node.txs.push(tx);
        signature
    }

    /// The transaction `signature` of this node, as it stands, appears on `other` too (its
    /// slot moving up to it): a second node of the same cluster that has seen it.
    pub fn share_with(&self, other: &FakeSolana, signature: &str) {
        let tx = {
            let node = self.node.lock().expect("node");
            node.txs
                .iter()
                .find(|tx| tx.signature == signature)
                .cloned()
                .expect("a transaction of this node")
        };
        let mut other = other.node.lock().expect("node");
        other.slot = other.slot.max(tx.slot);
        other.txs.push(tx);
    }

    /// The fee every transaction of this node pays, in lamports.
    pub fn fee(&self) -> u64 {
        recorded(TRANSACTION)["response"]["result"]["meta"]["fee"]
            .as_u64()
            .unwrap_or(5000)
    }

    /// Every confirmed transaction becomes final, and the slot moves on.
    pub fn finalize_all(&self) {
        let mut node = self.node.lock().expect("node");
        node.slot += 32;
        for tx in &mut node.txs {
            if tx.commitment == Commitment::Confirmed {
                tx.commitment = Commitment::Finalized;
            }
        }
    }

    /// A confirmed transaction's fork is abandoned: it is gone.
    pub fn drop_transaction(&self, signature: &str) {
        let mut node = self.node.lock().expect("node");
        for tx in &mut node.txs {
            if tx.signature == signature {
                assert_eq!(
                    tx.commitment,
                    Commitment::Confirmed,
                    "a final transaction stays"
                );
                tx.commitment = Commitment::Dropped;
            }
        }
    }

    /// Signature listings answer as a node behind the cluster, which knows nothing after
    /// `slot` (and so ignores an `until` it does not know, solana issue 24620); `None`: as the
    /// cluster. Returns the current slot.
    pub fn listings_behind(&self, slot: Option<u64>) -> u64 {
        let mut node = self.node.lock().expect("node");
        node.listings_behind = slot;
        node.slot
    }

    /// Queues faults for the next requests.
    pub fn inject(&self, faults: impl IntoIterator<Item = Fault>) {
        self.node.lock().expect("node").faults.extend(faults);
    }

    /// Faults queued and not met yet.
    pub fn pending_faults(&self) -> usize {
        self.node.lock().expect("node").faults.len()
    }
}

fn solana_signature_text() -> String {
    let bytes: [u8; 64] = std::array::from_fn(|_| rand::random());
    solana_signature::Signature::from(bytes).to_string()
}

async fn answer(State(node): State<Arc<Mutex<Node>>>, body: Bytes) -> Response {
    let request: Value = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(_) => return (StatusCode::BAD_REQUEST, "not JSON").into_response(),
    };
    let fault = node.lock().expect("node").faults.pop_front();
    match fault {
        Some(Fault::TooManyRequests) => {
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", "0")],
                "Too many requests for a specific RPC call",
            )
                .into_response();
        }
        Some(Fault::Slow(delay)) => tokio::time::sleep(delay).await,
        None => {}
    }
    let reply = {
        let node = node.lock().expect("node");
        match respond(&node, &request) {
            Ok(result) => json!({"jsonrpc": "2.0", "result": result, "id": request["id"]}),
            Err((code, message)) => json!({
                "jsonrpc": "2.0",
                "error": {"code": code, "message": message},
                "id": request["id"],
            }),
        }
    };
    ([("content-type", "application/json")], reply.to_string()).into_response()
}

fn commitment_of(config: &Value) -> &str {
    config["commitment"].as_str().unwrap_or("finalized")
}

fn visible(tx: &Tx, commitment: &str) -> bool {
    match tx.commitment {
        Commitment::Dropped => false,
        Commitment::Finalized => true,
        Commitment::Confirmed => commitment != "finalized",
    }
}

fn status_text(tx: &Tx) -> &'static str {
    match tx.commitment {
        Commitment::Finalized => "finalized",
        _ => "confirmed",
    }
}

fn error_value(tx: &Tx) -> Value {
    if tx.failed {
        json!({"InstructionError": [1, {"Custom": 1}]})
    } else {
        Value::Null
    }
}

fn respond(node: &Node, request: &Value) -> Result<Value, (i64, String)> {
    let params = &request["params"];
    let finalized_slot = node
        .txs
        .iter()
        .filter(|t| t.commitment == Commitment::Finalized)
        .map(|t| t.slot)
        .max()
        .unwrap_or(node.slot.saturating_sub(32))
        .max(node.slot.saturating_sub(32));
    let below_confirmed = || {
        (
            -32602,
            "Method does not support commitment below `confirmed`".to_owned(),
        )
    };
    match request["method"].as_str().unwrap_or_default() {
        "getSlot" => Ok(match commitment_of(&params[0]) {
            "finalized" => json!(finalized_slot),
            _ => json!(node.slot),
        }),
        "getBlockHeight" => Ok(json!(node.slot - 1)),
        "getSignaturesForAddress" => {
            let address = params[0].as_str().unwrap_or_default();
            let config = &params[1];
            let commitment = commitment_of(config);
            if commitment == "processed" {
                return Err(below_confirmed());
            }
            let limit = config["limit"].as_u64().unwrap_or(1000).min(1000) as usize;
            let mut newest_first: Vec<&Tx> = node
                .txs
                .iter()
                .rev()
                .filter(|t| visible(t, commitment) && t.keys().contains(&address))
                .filter(|t| node.listings_behind.is_none_or(|behind| t.slot <= behind))
                .collect();
            if let Some(before) = config["before"].as_str() {
                let at = newest_first.iter().position(|t| t.signature == before);
                newest_first = at.map_or(Vec::new(), |at| newest_first.split_off(at + 1));
            }
            if let Some(until) = config["until"].as_str()
                && let Some(at) = newest_first.iter().position(|t| t.signature == until)
            {
                newest_first.truncate(at);
            }
            newest_first.truncate(limit);
            let template = recorded(SIGNATURES)["exchange_guide"]["response"]["result"][0].clone();
            Ok(Value::Array(
                newest_first
                    .into_iter()
                    .map(|tx| {
                        let mut item = template.clone();
                        item["signature"] = json!(tx.signature);
                        item["slot"] = json!(tx.slot);
                        item["blockTime"] = json!(tx.block_time);
                        item["err"] = error_value(tx);
                        item["confirmationStatus"] = json!(status_text(tx));
                        item
                    })
                    .collect(),
            ))
        }
        "getTransaction" => {
            let signature = params[0].as_str().unwrap_or_default();
            let config = &params[1];
            let commitment = commitment_of(config);
            if commitment == "processed" {
                return Err(below_confirmed());
            }
            if config["encoding"] != "jsonParsed" {
                return Err((-32602, "this fake node serves jsonParsed only".into()));
            }
            Ok(node
                .txs
                .iter()
                .find(|t| t.signature == signature && visible(t, commitment))
                .map_or(Value::Null, transaction))
        }
        "getSignatureStatuses" => {
            let signatures = params[0].as_array().cloned().unwrap_or_default();
            let template = recorded(STATUSES)["response"]["result"]["value"][0].clone();
            let value: Vec<Value> = signatures
                .iter()
                .map(|s| {
                    node.txs
                        .iter()
                        .find(|t| Some(t.signature.as_str()) == s.as_str())
                        .filter(|t| t.commitment != Commitment::Dropped)
                        .map_or(Value::Null, |tx| {
                            let mut status = template.clone();
                            status["slot"] = json!(tx.slot);
                            status["confirmations"] = match tx.commitment {
                                Commitment::Finalized => Value::Null,
                                _ => json!(node.slot - tx.slot),
                            };
                            status["err"] = error_value(tx);
                            status["status"] = if tx.failed {
                                json!({"Err": error_value(tx)})
                            } else {
                                json!({"Ok": null})
                            };
                            status["confirmationStatus"] = json!(status_text(tx));
                            status
                        })
                })
                .collect();
            Ok(json!({"context": {"slot": node.slot}, "value": value}))
        }
        "getLatestBlockhash" => {
            let mut hash = [0; 32];
            hash[..8].copy_from_slice(&node.slot.to_le_bytes());
            Ok(json!({
                "context": {"slot": node.slot},
                "value": {
                    "blockhash": solana_message::Hash::new_from_array(hash).to_string(),
                    "lastValidBlockHeight": node.slot - 1 + 150,
                },
            }))
        }
        "getFeeForMessage" => {
            use base64::Engine as _;
            let message = base64::engine::general_purpose::STANDARD
                .decode(params[0].as_str().unwrap_or_default())
                .map_err(|e| (-32602, format!("invalid message: {e}")))?;
            let signatures = message.first().copied().unwrap_or(0);
            Ok(json!({"context": {"slot": node.slot}, "value": 5_000 * u64::from(signatures)}))
        }
        "getBalance" => {
            let address = params[0].as_str().unwrap_or_default();
            let commitment = commitment_of(&params[1]);
            let mut lamports: i128 = 0;
            for tx in node.txs.iter().filter(|t| visible(t, commitment)) {
                let moved = if tx.failed {
                    0
                } else {
                    i128::from(tx.lamports)
                };
                if tx.to == address {
                    lamports += moved;
                }
                if tx.payer == address {
                    lamports -= moved + 5_000;
                }
            }
            Ok(json!({"context": {"slot": node.slot}, "value": lamports.max(0)}))
        }
        other => Err((-32601, format!("Method not found: {other}"))),
    }
}

/// `getTransaction` (jsonParsed) of a system transfer from the recorded Solana Pay template:
/// payer, recipient, the system program, then the reference as a read-only account.
fn transaction(tx: &Tx) -> Value {
    let mut result = recorded(TRANSACTION)["response"]["result"].clone();
    result["slot"] = json!(tx.slot);
    result["blockTime"] = json!(tx.block_time);
    let fee = result["meta"]["fee"].as_u64().unwrap_or(5000);
    let moved = if tx.failed { 0 } else { tx.lamports };
    let payer_before = 10_000_000_000u64 + tx.lamports + fee;
    let to_before = 1_000_000_000u64;
    let mut pre = vec![payer_before, to_before, 1];
    let mut post = vec![payer_before - moved - fee, to_before + moved, 1];
    let template_keys = result["transaction"]["message"]["accountKeys"].clone();
    let mut keys = vec![
        template_keys[0].clone(),
        template_keys[1].clone(),
        template_keys[2].clone(),
    ];
    keys[0]["pubkey"] = json!(tx.payer);
    keys[1]["pubkey"] = json!(tx.to);
    if let Some(reference) = &tx.reference {
        let mut key = template_keys[4].clone();
        key["pubkey"] = json!(reference);
        keys.push(key);
        pre.push(0);
        post.push(0);
    }
    result["transaction"]["message"]["accountKeys"] = Value::Array(keys);
    let instruction = result["transaction"]["message"]["instructions"][1].clone();
    let mut instruction = instruction;
    instruction["parsed"]["info"] =
        json!({"destination": tx.to, "lamports": tx.lamports, "source": tx.payer});
    result["transaction"]["message"]["instructions"] = json!([instruction]);
    result["transaction"]["signatures"] = json!([tx.signature]);
    result["meta"]["preBalances"] = json!(pre);
    result["meta"]["postBalances"] = json!(post);
    result["meta"]["err"] = error_value(tx);
    result["meta"]["status"] = if tx.failed {
        json!({"Err": error_value(tx)})
    } else {
        json!({"Ok": null})
    };
    result["meta"]["logMessages"] = json!([
        "Program 11111111111111111111111111111111 invoke [1]",
        "Program 11111111111111111111111111111111 success"
    ]);
    result
}
