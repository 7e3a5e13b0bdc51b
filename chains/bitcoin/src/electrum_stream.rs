//! The connection to an Electrum server: TCP or TLS, with timeouts, a cap on the length of one
//! line, and script notifications the client can read.
//!
//! The Electrum protocol is one JSON document per line, and `electrum-client` reads a line
//! with `BufRead::read_line`, which keeps reading until a newline comes: a server that sends
//! one endless line grows the reader without bound (seen: 3 GB within a minute). The crate
//! cannot be told a limit, so the stream under it is wrapped: past `max_line_bytes` without a
//! newline, a read fails, the line is refused, and the watcher reconnects with backoff.
//!
//! The same wrapper mends one message the crate (0.25) cannot read. A script's status is null
//! once its history is empty, which happens when a reorg or a replacement takes away the only
//! transaction paying it; the crate reads a notification's status as a hash, and the whole
//! read then fails, so the watcher would take a real server's answer for garbage. Such a
//! status is handed on as the all-zero hash, which no history hashes to: the watcher sees a
//! change and reads the history again, which is all a status is for.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use electrum_client::raw_client::RawClient;
use payrecon_chain_core::{ScanError, SecretUrl};
use rustls::pki_types::ServerName;

/// Something to read and write an Electrum session over: a TCP or a TLS stream.
trait Link: Read + Write + Send {}

impl<T: Read + Write + Send> Link for T {}

/// How much is read from the link at a time.
const CHUNK_BYTES: usize = 16 << 10;

/// A stream that hands on whole lines only: each is checked against the cap and mended
/// before the client sees it.
pub(crate) struct LineCapped {
    inner: Box<dyn Link>,
    max_line_bytes: usize,
    /// The line being read, not yet ended by a newline.
    line: Vec<u8>,
    /// Whole lines ready for the client, of which `handed` bytes have been read.
    ready: Vec<u8>,
    handed: usize,
}

impl LineCapped {
    fn new(inner: Box<dyn Link>, max_line_bytes: usize) -> LineCapped {
        LineCapped {
            inner,
            max_line_bytes,
            line: Vec::new(),
            ready: Vec::new(),
            handed: 0,
        }
    }

    fn too_long(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the server sent a line of more than {} bytes: refused",
                self.max_line_bytes
            ),
        )
    }
}

impl Read for LineCapped {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.handed == self.ready.len() {
            self.ready.clear();
            self.handed = 0;
            let mut chunk = [0; CHUNK_BYTES];
            let n = self.inner.read(&mut chunk)?;
            if n == 0 {
                // The end of the stream: what there is of a last line goes on as it is.
                self.ready.append(&mut self.line);
                if self.ready.is_empty() {
                    return Ok(0);
                }
                break;
            }
            for piece in chunk[..n].split_inclusive(|b| *b == b'\n') {
                self.line.extend_from_slice(piece);
                let ended = piece.ends_with(b"\n");
                if self.line.len() - usize::from(ended) > self.max_line_bytes {
                    return Err(self.too_long());
                }
                if ended {
                    mend_empty_status(&mut self.line);
                    self.ready.append(&mut self.line);
                }
            }
        }
        let n = buf.len().min(self.ready.len() - self.handed);
        buf[..n].copy_from_slice(&self.ready[self.handed..self.handed + n]);
        self.handed += n;
        Ok(n)
    }
}

/// The notification of a script whose history became empty, with its null status replaced by
/// the all-zero hash (see the module's note); every other line is left as it came.
fn mend_empty_status(line: &mut Vec<u8>) {
    const METHOD: &str = "blockchain.scripthash.subscribe";
    if !line.windows(METHOD.len()).any(|w| w == METHOD.as_bytes()) {
        return;
    }
    let Ok(mut message) = serde_json::from_slice::<serde_json::Value>(line) else {
        return;
    };
    if message.get("method").and_then(serde_json::Value::as_str) != Some(METHOD) {
        return;
    }
    match message.pointer_mut("/params/1") {
        Some(status) if status.is_null() => *status = "0".repeat(64).into(),
        _ => return,
    }
    *line = serde_json::to_vec(&message).expect("a JSON value serializes");
    line.push(b'\n');
}

impl Write for LineCapped {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// An Electrum session over a capped stream.
pub(crate) type ElectrumClient = RawClient<LineCapped>;

/// Connects to `url` (`tcp://host:port` or `ssl://host:port`, the certificate checked against
/// the web's roots) within `timeout`, each read and write bounded by it too.
pub(crate) fn connect(
    url: &SecretUrl,
    timeout: Duration,
    max_line_bytes: usize,
) -> Result<ElectrumClient, ScanError> {
    let raw = url.expose();
    let (tls, address) = match raw.split_once("://") {
        Some(("ssl", address)) => (true, address),
        Some(("tcp", address)) => (false, address),
        None => (false, raw),
        Some((scheme, _)) => {
            return Err(ScanError::Fatal(format!(
                "Electrum URL {url}: scheme {scheme:?} is neither tcp nor ssl"
            )));
        }
    };
    let address = address.trim_end_matches('/');
    let tcp = connect_tcp(url, address, timeout)?;
    let link: Box<dyn Link> = if tls {
        Box::new(tls_stream(url, address, tcp)?)
    } else {
        Box::new(tcp)
    };
    Ok(RawClient::from(LineCapped::new(link, max_line_bytes)))
}

fn connect_tcp(url: &SecretUrl, address: &str, timeout: Duration) -> Result<TcpStream, ScanError> {
    let unreachable = |e: io::Error| ScanError::Transient(format!("Electrum {url}: {e}"));
    let mut last = None;
    for socket in address.to_socket_addrs().map_err(unreachable)? {
        match TcpStream::connect_timeout(&socket, timeout) {
            Ok(stream) => {
                stream
                    .set_read_timeout(Some(timeout))
                    .map_err(unreachable)?;
                stream
                    .set_write_timeout(Some(timeout))
                    .map_err(unreachable)?;
                stream.set_nodelay(true).map_err(unreachable)?;
                return Ok(stream);
            }
            Err(error) => last = Some(error),
        }
    }
    Err(unreachable(last.unwrap_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, "the host has no address")
    })))
}

fn tls_stream(
    url: &SecretUrl,
    address: &str,
    tcp: TcpStream,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>, ScanError> {
    let refuse = |what: String| ScanError::Fatal(format!("Electrum URL {url}: {what}"));
    let host = address
        .rsplit_once(':')
        .map_or(address, |(host, _)| host)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let name = ServerName::try_from(host.to_owned())
        .map_err(|e| refuse(format!("{host:?} is not a host name: {e}")))?;
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| refuse(format!("TLS: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connection = rustls::ClientConnection::new(Arc::new(config), name)
        .map_err(|e| refuse(format!("TLS: {e}")))?;
    Ok(rustls::StreamOwned::new(connection, tcp))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capped(bytes: &'static [u8], max_line_bytes: usize) -> LineCapped {
        LineCapped::new(Box::new(io::Cursor::new(bytes.to_vec())), max_line_bytes)
    }

    #[test]
    fn lines_within_the_cap_pass_and_an_endless_one_is_refused() {
        let mut ok = capped(b"{\"id\":1}\n{\"id\":2}\n", 10);
        let mut all = String::new();
        ok.read_to_string(&mut all).unwrap();
        assert_eq!(all.lines().count(), 2);

        let mut endless = capped(&[b'x'; 4096], 1000);
        let mut buf = vec![0u8; 512];
        let mut read = 0;
        let error = loop {
            match endless.read(&mut buf) {
                Ok(n) => read += n,
                Err(error) => break error,
            }
        };
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert_eq!(read, 0, "nothing of a refused line reaches the client");
    }

    #[test]
    fn the_count_restarts_after_each_newline() {
        let mut stream = capped(b"aaaa\nbbbb\ncccc\n", 4);
        let mut all = Vec::new();
        stream.read_to_end(&mut all).unwrap();
        assert_eq!(all, b"aaaa\nbbbb\ncccc\n");
    }

    #[test]
    fn lines_split_across_reads_come_out_whole_and_in_order() {
        let mut stream = capped(b"{\"id\":1}\n{\"id\":2", 100);
        let mut one = [0u8; 3];
        let mut all = Vec::new();
        loop {
            let n = stream.read(&mut one).unwrap();
            if n == 0 {
                break;
            }
            all.extend_from_slice(&one[..n]);
        }
        assert_eq!(all, b"{\"id\":1}\n{\"id\":2");
    }

    /// ElectrumX 2.0's notification for a script whose only payment a reorg took away
    /// (recorded from the devnet; the server pads its messages with spaces).
    const EMPTIED: &[u8] = b"{\"jsonrpc\":\"2.0\",\"method\":\"blockchain.scripthash.subscribe\",\
        \"params\":[\"98e95aa4f1833540b2932952d9b681ce146b73506b040300c4aecc9ae7cc8619\",null]      }\n";

    #[test]
    fn an_emptied_scripts_notification_reads_as_a_change() {
        let notification = |line: &[u8]| {
            let message: serde_json::Value = serde_json::from_slice(line).unwrap();
            serde_json::from_value::<electrum_client::ScriptNotification>(message["params"].clone())
        };
        assert!(
            notification(EMPTIED).is_err(),
            "the client cannot read it as sent"
        );

        let mut mended = Vec::new();
        capped(EMPTIED, 1000).read_to_end(&mut mended).unwrap();
        let read = notification(&mended).expect("mended, the client reads it");
        assert_eq!(*read.status, [0; 32]);
        assert_eq!(
            payrecon_chain_core::bitcoin::hex::DisplayHex::to_lower_hex_string(
                &read.scripthash[..]
            ),
            "98e95aa4f1833540b2932952d9b681ce146b73506b040300c4aecc9ae7cc8619"
        );

        let answer = b"{\"jsonrpc\":\"2.0\",\"result\":null,\"id\":7}\n";
        let mut untouched = Vec::new();
        capped(answer, 1000).read_to_end(&mut untouched).unwrap();
        assert_eq!(
            untouched, answer,
            "an answer's null (a script never paid) is the client's to read"
        );
    }
}
