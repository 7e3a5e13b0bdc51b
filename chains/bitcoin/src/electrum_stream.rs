//! The connection to an Electrum server: TCP or TLS, with timeouts, and a cap on the length of
//! one line.
//!
//! The Electrum protocol is one JSON document per line, and `electrum-client` reads a line
//! with `BufRead::read_line`, which keeps reading until a newline comes: a server that sends
//! one endless line grows the reader without bound (seen: 3 GB within a minute). The crate
//! cannot be told a limit, so the stream under it is wrapped: past `max_line_bytes` without a
//! newline, a read fails, the line is refused, and the watcher reconnects with backoff.

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

/// A stream whose reads fail once a line runs past its cap.
pub(crate) struct LineCapped {
    inner: Box<dyn Link>,
    max_line_bytes: usize,
    /// Bytes read since the last newline.
    line: usize,
}

impl LineCapped {
    fn new(inner: Box<dyn Link>, max_line_bytes: usize) -> LineCapped {
        LineCapped {
            inner,
            max_line_bytes,
            line: 0,
        }
    }
}

impl Read for LineCapped {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let read = &buf[..n];
        self.line = match read.iter().rposition(|b| *b == b'\n') {
            Some(last) => n - last - 1,
            None => self.line.saturating_add(n),
        };
        if self.line > self.max_line_bytes {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the server sent a line of more than {} bytes: refused",
                    self.max_line_bytes
                ),
            ));
        }
        Ok(n)
    }
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
        assert!(
            read <= 1000 + 512,
            "refused within one read of the cap: {read}"
        );
    }

    #[test]
    fn the_count_restarts_after_each_newline() {
        let mut stream = capped(b"aaaa\nbbbb\ncccc\n", 4);
        let mut all = Vec::new();
        stream.read_to_end(&mut all).unwrap();
        assert_eq!(all.len(), 15);
    }
}
