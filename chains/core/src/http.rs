//! Reading an HTTP answer with a size cap: what every HTTP client of payrecon shares. A node,
//! a provider or a proxy in between that answers without end must cost a bounded amount of
//! memory, so an answer is read chunk by chunk and refused once it passes its cap (never cut
//! and parsed as if whole). Every client also starts from one builder with a connect and a
//! request timeout.

use std::time::Duration;

use crate::ScanError;

/// How every chain client starts: connecting and each whole request bounded by `timeout`.
pub fn client_builder(timeout: Duration) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .connect_timeout(timeout)
        .timeout(timeout)
        .user_agent(concat!("payrecon/", env!("CARGO_PKG_VERSION")))
}

/// `builder` built; a client that cannot be made (no TLS backend) refuses the source.
pub fn build_client(builder: reqwest::ClientBuilder) -> Result<reqwest::Client, ScanError> {
    builder
        .build()
        .map_err(|e| ScanError::Fatal(format!("HTTP client: {}", e.without_url())))
}

/// Why an answer's body could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// It is longer than the cap: refused, and the connection dropped.
    #[error("the answer is larger than {cap} bytes: refused")]
    TooLarge {
        /// The cap it passed.
        cap: usize,
    },
    /// The connection failed or timed out before the end.
    #[error("the answer was cut short: {0}")]
    Cut(String),
}

/// The body of `response`, if it is at most `cap` bytes. A `Content-Length` over the cap is
/// refused before anything is read.
pub async fn read_body(mut response: reqwest::Response, cap: usize) -> Result<Vec<u8>, BodyError> {
    if response
        .content_length()
        .is_some_and(|length| length > cap as u64)
    {
        return Err(BodyError::TooLarge { cap });
    }
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > cap {
                    return Err(BodyError::TooLarge { cap });
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body),
            Err(error) => return Err(BodyError::Cut(error.without_url().to_string())),
        }
    }
}

/// [`read_body`] as text; bytes that are not UTF-8 are replaced, as `reqwest`'s own `text()`
/// does.
pub async fn read_text(response: reqwest::Response, cap: usize) -> Result<String, BodyError> {
    let body = read_body(response, cap).await?;
    Ok(match String::from_utf8(body) {
        Ok(text) => text,
        Err(error) => String::from_utf8_lossy(error.as_bytes()).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server that answers every connection with `head` and then `body_bytes` of `x`.
    async fn serve(head: &'static str, body_bytes: usize) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut request = [0u8; 4096];
                let _ = socket.read(&mut request).await;
                let _ = socket.write_all(head.as_bytes()).await;
                let chunk = vec![b'x'; 64 * 1024];
                let mut sent = 0;
                while sent < body_bytes {
                    let n = chunk.len().min(body_bytes - sent);
                    if socket.write_all(&chunk[..n]).await.is_err() {
                        break;
                    }
                    sent += n;
                }
            }
        });
        format!("http://{address}/")
    }

    #[tokio::test]
    async fn an_endless_answer_is_refused_at_the_cap() {
        let url = serve("HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n", usize::MAX).await;
        let response = reqwest::get(&url).await.unwrap();
        assert_eq!(
            read_body(response, 1 << 20).await,
            Err(BodyError::TooLarge { cap: 1 << 20 })
        );
    }

    #[tokio::test]
    async fn a_declared_length_over_the_cap_is_refused_unread_and_one_under_it_read_whole() {
        let url = serve("HTTP/1.1 200 OK\r\ncontent-length: 2000\r\n\r\n", 2000).await;
        let response = reqwest::get(&url).await.unwrap();
        assert_eq!(
            read_body(response, 1000).await,
            Err(BodyError::TooLarge { cap: 1000 })
        );
        let response = reqwest::get(&url).await.unwrap();
        assert_eq!(read_text(response, 2000).await.unwrap().len(), 2000);
    }
}
