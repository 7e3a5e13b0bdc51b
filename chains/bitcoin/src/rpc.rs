//! Bitcoin Core's JSON-RPC over HTTP (Litecoin Core speaks the same): the calls the full-node
//! scanner makes, batched where a scan asks many of one kind, with retries.
//!
//! Authentication is a user and password (`rpcuser`/`rpcpassword`, or `rpcauth` on the node)
//! or the node's cookie file. The cookie changes each time the node starts, so it is read
//! again whenever the node refuses it.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use payrecon_chain_core::http::{build_client, client_builder, read_text};
use payrecon_chain_core::{Attempt, RetryPolicy, ScanError, Secret, SecretUrl};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_json::value::RawValue;

/// The node is still loading its block index: ask again.
const RPC_IN_WARMUP: i64 = -28;

/// How long an unused connection to the node is kept. Bitcoin Core closes an RPC connection
/// idle for `rpcservertimeout` (30 s by default, lower where operators set it); a pooled
/// connection idle that long can be picked for a request just as the node closes it, and the
/// request fails. Polling every couple of seconds keeps the busy connection open regardless.
const IDLE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(4);

/// How the node knows payrecon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeAuth {
    /// `rpcuser`/`rpcpassword` or an `rpcauth` line on the node.
    UserPassword {
        /// The user.
        user: String,
        /// The password.
        password: Secret,
    },
    /// The node's `.cookie` file (in its data directory, per network), read again after the
    /// node restarts.
    Cookie(PathBuf),
    /// No credentials (a proxy in front of the node adds them).
    None,
}

/// An error the node answered in place of a result.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, thiserror::Error)]
#[error("node error {code}: {message}")]
pub struct RpcError {
    /// Bitcoin Core's error code (`RPC_INVALID_PARAMETER` = -8, …).
    pub code: i64,
    /// What the node said.
    pub message: String,
}

impl RpcError {
    /// Errors that say the request itself is wrong: asking again cannot help.
    fn is_permanent(&self) -> bool {
        // Method not found, invalid request or parameters, parse error.
        matches!(self.code, -32601 | -32600 | -32602 | -32700)
    }

    /// The node answered something a scan cannot go past: fatal if permanent, else the scan
    /// is repeated later.
    pub(crate) fn into_scan_error(self, method: &str) -> ScanError {
        let reason = format!("{method}: {self}");
        if self.is_permanent() {
            ScanError::Fatal(reason)
        } else {
            ScanError::Transient(reason)
        }
    }
}

#[derive(Deserialize)]
struct Reply {
    result: Option<Box<RawValue>>,
    error: Option<RpcError>,
    id: Option<u64>,
}

/// A JSON-RPC client for one node.
pub(crate) struct NodeRpc {
    http: reqwest::Client,
    url: SecretUrl,
    /// The largest answer read; a larger one is refused (and retried).
    max_answer_bytes: usize,
    auth: NodeAuth,
    /// The cookie as last read.
    cookie: Mutex<Option<(String, String)>>,
    next_id: AtomicU64,
    retry: RetryPolicy,
}

impl NodeRpc {
    /// A client for the node at `url` (`http://host:port`; user and password may be given in
    /// it instead of in `auth`).
    pub(crate) fn new(
        url: &SecretUrl,
        auth: NodeAuth,
        timeout: Duration,
        max_answer_bytes: usize,
    ) -> Result<NodeRpc, ScanError> {
        let mut parsed = reqwest::Url::parse(url.expose())
            .map_err(|e| ScanError::Fatal(format!("node RPC URL {url}: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(ScanError::Fatal(format!(
                "node RPC URL {url}: expected http:// or https://"
            )));
        }
        let auth = match auth {
            NodeAuth::None if !parsed.username().is_empty() => {
                let decode = |text: &str| {
                    percent_decode(text)
                        .ok_or_else(|| ScanError::Fatal(format!("node RPC URL {url}: bad escape")))
                };
                NodeAuth::UserPassword {
                    user: decode(parsed.username())?,
                    password: decode(parsed.password().unwrap_or_default())?.into(),
                }
            }
            other => other,
        };
        let _ = parsed.set_username("");
        let _ = parsed.set_password(None);
        let http =
            build_client(client_builder(timeout).pool_idle_timeout(IDLE_CONNECTION_TIMEOUT))?;
        Ok(NodeRpc {
            http,
            url: SecretUrl::new(parsed.to_string()),
            max_answer_bytes,
            auth,
            cookie: Mutex::new(None),
            next_id: AtomicU64::new(1),
            retry: RetryPolicy::default(),
        })
    }

    /// Where the node is, without credentials: for logs and errors.
    pub(crate) fn url(&self) -> &SecretUrl {
        &self.url
    }

    /// Calls `method`; the node's own error is the caller's to judge.
    pub(crate) async fn try_call<T: DeserializeOwned>(
        &self,
        method: &str,
        params: Value,
    ) -> Result<Result<T, RpcError>, ScanError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let body =
            serde_json::json!({"jsonrpc": "1.0", "id": id, "method": method, "params": params});
        let text = self.post(method, &body).await?;
        let reply: Reply = decode(method, &text)?;
        result_of(method, reply)
    }

    /// Calls `method`; an error the node answers fails the scan (for later, unless the request
    /// itself is wrong).
    pub(crate) async fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        params: Value,
    ) -> Result<T, ScanError> {
        self.try_call(method, params)
            .await?
            .map_err(|e| e.into_scan_error(method))
    }

    /// Calls `method` once per entry of `params` in one request; the answers come back in the
    /// order asked, each the result or the node's error for it.
    pub(crate) async fn batch<T: DeserializeOwned>(
        &self,
        method: &str,
        params: &[Value],
    ) -> Result<Vec<Result<T, RpcError>>, ScanError> {
        if params.is_empty() {
            return Ok(Vec::new());
        }
        let first = self
            .next_id
            .fetch_add(params.len() as u64, Ordering::Relaxed);
        let body: Vec<Value> = params
            .iter()
            .zip(first..)
            .map(|(params, id)| {
                serde_json::json!({"jsonrpc": "1.0", "id": id, "method": method, "params": params})
            })
            .collect();
        let text = self.post(method, &Value::Array(body)).await?;
        let replies: Vec<Reply> = decode(method, &text)?;
        if replies.len() != params.len() {
            return Err(ScanError::Fatal(format!(
                "{method}: asked {} calls in one batch, the node answered {}",
                params.len(),
                replies.len()
            )));
        }
        let mut ordered: Vec<Option<Result<T, RpcError>>> =
            (0..params.len()).map(|_| None).collect();
        for reply in replies {
            let slot = reply
                .id
                .and_then(|id| id.checked_sub(first))
                .and_then(|i| usize::try_from(i).ok())
                .and_then(|i| ordered.get_mut(i))
                .filter(|slot| slot.is_none())
                .ok_or_else(|| {
                    ScanError::Fatal(format!("{method}: a batch answer has an id never asked"))
                })?;
            *slot = Some(result_of(method, reply)?);
        }
        Ok(ordered
            .into_iter()
            .map(|r| r.expect("every id answered once"))
            .collect())
    }

    async fn post(&self, method: &str, body: &Value) -> Result<String, ScanError> {
        let body = body.to_string();
        self.retry.run(method, || self.attempt(method, &body)).await
    }

    fn credentials(&self) -> Result<Option<(String, String)>, Attempt> {
        match &self.auth {
            NodeAuth::None => Ok(None),
            NodeAuth::UserPassword { user, password } => {
                Ok(Some((user.clone(), password.expose().to_owned())))
            }
            NodeAuth::Cookie(path) => {
                let mut cookie = self.cookie.lock().expect("cookie lock");
                if cookie.is_none() {
                    // The node writes the cookie when it starts: until then, it is not up.
                    let text = std::fs::read_to_string(path).map_err(|e| {
                        Attempt::retry(format!("cookie file {}: {e}", path.display()))
                    })?;
                    let (user, password) = text.trim().split_once(':').ok_or_else(|| {
                        Attempt::Fatal(format!(
                            "cookie file {} is not user:password",
                            path.display()
                        ))
                    })?;
                    *cookie = Some((user.to_owned(), password.to_owned()));
                }
                Ok(cookie.clone())
            }
        }
    }

    async fn attempt(&self, method: &str, body: &str) -> Result<String, Attempt> {
        let mut request = self
            .http
            .post(self.url.expose())
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some((user, password)) = self.credentials()? {
            request = request.basic_auth(user, Some(password));
        }
        let response = request.send().await.map_err(|e| {
            Attempt::retry(format!("{method} at {}: {}", self.url, e.without_url()))
        })?;
        let status = response.status().as_u16();
        // Too large is retried like a cut answer: a node does not answer gigabytes, something
        // between us and it does, and the watcher says so while it waits.
        let text = read_text(response, self.max_answer_bytes)
            .await
            .map_err(|e| Attempt::retry(format!("{method}: {e}")))?;
        let excerpt: String = text.chars().take(200).collect();
        match status {
            401 => {
                return if matches!(self.auth, NodeAuth::Cookie(_)) {
                    // A restarted node wrote a new cookie: read it again.
                    *self.cookie.lock().expect("cookie lock") = None;
                    Err(Attempt::retry(format!(
                        "{method}: the node refused the cookie"
                    )))
                } else {
                    Err(Attempt::Fatal(format!(
                        "the node at {} refused the RPC user and password",
                        self.url
                    )))
                };
            }
            403 => {
                return Err(Attempt::Fatal(format!(
                    "the node at {} does not allow {method} for this user (rpcwhitelist)",
                    self.url
                )));
            }
            // Its work queue is full, or something between us and it is.
            429 | 502 | 503 | 504 => {
                return Err(Attempt::retry(format!(
                    "{method}: HTTP {status}: {excerpt}"
                )));
            }
            _ => {}
        }
        // Errors come with HTTP 500 (or 404 for an unknown method) and a JSON-RPC body.
        match serde_json::from_str::<Value>(&text) {
            Err(error) if error.is_eof() => Err(Attempt::retry(format!(
                "{method}: the answer was cut short: {error}"
            ))),
            // A server error in plain text is the server's trouble, not an answer: a stopping
            // node answers "Unhandled request" for each request its work queue dropped.
            Err(_) if (500..600).contains(&status) => Err(Attempt::retry(format!(
                "{method}: HTTP {status}: {excerpt}"
            ))),
            Err(_) => Err(Attempt::Fatal(format!(
                "{method} answered HTTP {status} with a body that is not JSON: {excerpt}"
            ))),
            Ok(Value::Object(reply))
                if reply
                    .get("error")
                    .and_then(|e| e.get("code"))
                    .and_then(Value::as_i64)
                    == Some(RPC_IN_WARMUP) =>
            {
                Err(Attempt::retry(format!(
                    "{method}: the node is starting: {excerpt}"
                )))
            }
            Ok(_) => Ok(text),
        }
    }
}

fn result_of<T: DeserializeOwned>(
    method: &str,
    reply: Reply,
) -> Result<Result<T, RpcError>, ScanError> {
    if let Some(error) = reply.error {
        return Ok(Err(error));
    }
    let raw = reply.result.as_deref().map_or("null", RawValue::get);
    decode(method, raw).map(Ok)
}

/// A complete answer that does not have the documented shape cannot be trusted.
fn decode<T: DeserializeOwned>(method: &str, text: &str) -> Result<T, ScanError> {
    serde_json::from_str(text)
        .map_err(|e| ScanError::Fatal(payrecon_chain_core::malformed(method, &e, text)))
}

/// `%XX` escapes of a URL's user or password.
fn percent_decode(text: &str) -> Option<String> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .ok()
        .map(|text| text.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_in_the_url_are_taken_out_of_it() {
        let rpc = NodeRpc::new(
            &SecretUrl::new("http://us%40er:p%3Ass@127.0.0.1:19443"),
            NodeAuth::None,
            Duration::from_secs(1),
            1 << 20,
        )
        .unwrap();
        assert_eq!(rpc.url().expose(), "http://127.0.0.1:19443/");
        assert_eq!(
            rpc.auth,
            NodeAuth::UserPassword {
                user: "us@er".into(),
                password: "p:ss".into()
            }
        );
        let tcp = SecretUrl::new("tcp://x:1");
        assert!(NodeRpc::new(&tcp, NodeAuth::None, Duration::from_secs(1), 1 << 20).is_err());
    }

    /// A node on a local port that answers each request with the next of `answers` (status and
    /// body), one connection per request.
    async fn node_answering(answers: Vec<(u16, &'static str)>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            for (status, body) in answers {
                let (mut socket, _) = listener.accept().await.unwrap();
                let mut request = Vec::new();
                let mut chunk = [0u8; 4096];
                // The request is small: read until its JSON body has ended.
                while !request.ends_with(b"}") && !request.ends_with(b"]") {
                    let n = socket.read(&mut chunk).await.unwrap();
                    assert!(n > 0, "the client hung up mid-request");
                    request.extend_from_slice(&chunk[..n]);
                }
                let reply = format!(
                    "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                socket.write_all(reply.as_bytes()).await.unwrap();
            }
        });
        url
    }

    fn client(url: &str) -> NodeRpc {
        NodeRpc::new(&url.into(), NodeAuth::None, Duration::from_secs(5), 1 << 20).unwrap()
    }

    #[tokio::test]
    async fn a_stopping_nodes_unhandled_request_is_asked_again() {
        let url = node_answering(vec![
            (500, "Unhandled request"),
            (200, r#"{"result":162,"error":null,"id":1}"#),
        ])
        .await;
        let rpc = client(&url);
        assert_eq!(rpc.call::<u64>("getblockcount", Value::Null).await, Ok(162));
    }

    #[tokio::test]
    async fn a_complete_answer_that_is_not_json_is_fatal() {
        let url = node_answering(vec![(200, "<html>a web server</html>")]).await;
        let rpc = client(&url);
        assert!(matches!(
            rpc.call::<u64>("getblockcount", Value::Null).await,
            Err(ScanError::Fatal(_))
        ));
    }

    #[test]
    fn a_node_error_is_the_callers_and_a_bad_shape_is_fatal() {
        let reply: Reply = serde_json::from_str(
            r#"{"result":null,"error":{"code":-8,"message":"Block height out of range"},"id":1}"#,
        )
        .unwrap();
        let answer: Result<String, RpcError> = result_of("getblockhash", reply).unwrap();
        assert_eq!(answer.unwrap_err().code, -8);
        let reply: Reply = serde_json::from_str(r#"{"result":5,"error":null,"id":1}"#).unwrap();
        assert!(matches!(
            result_of::<String>("getblockhash", reply),
            Err(ScanError::Fatal(_))
        ));
        let missing = RpcError {
            code: -32601,
            message: "Method not found".into(),
        };
        assert!(matches!(missing.into_scan_error("x"), ScanError::Fatal(_)));
    }
}
