//! The push channel of the full-node scanner: payrecon connects to its own node as a P2P peer
//! and listens for `inv` announcements of new blocks and transactions, the way NBXplorer
//! does. Unlike ZMQ it needs nothing compiled into the node (Debian's `litecoind` has no ZMQ),
//! only `listen=1`; `whitelist=noban@<payrecon's address>` lets the node announce
//! transactions at once instead of after its random delay for inbound peers.
//!
//! The channel only says "look now": what a block or transaction holds is still read over
//! RPC. A lost connection is retried with backoff and costs latency only, as the watcher keeps
//! polling.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use payrecon_chain_core::bitcoin::consensus::{deserialize, serialize};
use payrecon_chain_core::bitcoin::p2p::message::{NetworkMessage, RawNetworkMessage};
use payrecon_chain_core::bitcoin::p2p::message_blockdata::Inventory;
use payrecon_chain_core::bitcoin::p2p::message_network::VersionMessage;
use payrecon_chain_core::bitcoin::p2p::{Address, Magic, ServiceFlags};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// The protocol version offered: the last before `wtxidrelay`, which every supported node
/// speaks.
const PROTOCOL_VERSION: u32 = 70015;

/// The largest message read (the node's own limit is 4 MB; blocks are never asked for).
const MAX_MESSAGE_BYTES: usize = 32 * 1024 * 1024;

/// Pause after a lost connection; doubled up to [`MAX_RECONNECT_PAUSE`].
const FIRST_RECONNECT_PAUSE: Duration = Duration::from_secs(1);
const MAX_RECONNECT_PAUSE: Duration = Duration::from_secs(30);

/// How long the node has to answer the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A listener on the node's P2P port, running as its own task until dropped.
pub(crate) struct PushChannel {
    notify: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl PushChannel {
    /// Connects to `peer` (`host:port`) and keeps the connection up.
    pub(crate) fn start(peer: String, magic: Magic) -> PushChannel {
        let notify = Arc::new(Notify::new());
        let task = tokio::spawn(listen(peer, magic, notify.clone()));
        PushChannel { notify, task }
    }

    /// Resolves at the next announcement (or at once if one came since the last call).
    pub(crate) async fn news(&self) {
        self.notify.notified().await;
    }
}

impl Drop for PushChannel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn listen(peer: String, magic: Magic, notify: Arc<Notify>) {
    let mut pause = FIRST_RECONNECT_PAUSE;
    loop {
        match session(&peer, magic, &notify).await {
            Ok(()) => {
                tracing::warn!(%peer, "the node closed the P2P connection: polling until it is back")
            }
            Err(error) => {
                tracing::warn!(%peer, %error, retry_in = ?pause, "P2P announcements lost: polling until they are back")
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_RECONNECT_PAUSE);
        // Whatever was announced meanwhile was missed: look once.
        notify.notify_one();
    }
}

/// One connection: the handshake, then announcements until it fails.
async fn session(peer: &str, magic: Magic, notify: &Notify) -> std::io::Result<()> {
    let mut stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, TcpStream::connect(peer)).await??;
    stream.set_nodelay(true)?;
    let remote = stream.peer_addr()?;
    let local = stream.local_addr()?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut version = VersionMessage::new(
        ServiceFlags::NONE,
        i64::try_from(now).unwrap_or(i64::MAX),
        Address::new(&remote, ServiceFlags::NONE),
        Address::new(&local, ServiceFlags::NONE),
        rand_nonce(),
        concat!("/payrecon:", env!("CARGO_PKG_VERSION"), "/").to_owned(),
        0,
    );
    version.version = PROTOCOL_VERSION;
    version.relay = true;
    send(&mut stream, magic, NetworkMessage::Version(version)).await?;
    let mut ready = false;
    loop {
        let message = if ready {
            read(&mut stream, magic).await?
        } else {
            tokio::time::timeout(HANDSHAKE_TIMEOUT, read(&mut stream, magic)).await??
        };
        match message {
            Some(NetworkMessage::Version(_)) => {
                send(&mut stream, magic, NetworkMessage::Verack).await?;
            }
            Some(NetworkMessage::Verack) if !ready => {
                ready = true;
                tracing::info!(%peer, "hearing the node's P2P announcements");
            }
            Some(NetworkMessage::Ping(nonce)) => {
                send(&mut stream, magic, NetworkMessage::Pong(nonce)).await?;
            }
            Some(NetworkMessage::Inv(items)) if items.iter().any(announces_news) => {
                notify.notify_one();
            }
            Some(NetworkMessage::Headers(_) | NetworkMessage::CmpctBlock(_)) => {
                notify.notify_one();
            }
            _ => {}
        }
    }
}

fn announces_news(item: &Inventory) -> bool {
    matches!(
        item,
        Inventory::Block(_)
            | Inventory::WitnessBlock(_)
            | Inventory::Transaction(_)
            | Inventory::WitnessTransaction(_)
            | Inventory::WTx(_)
    )
}

fn rand_nonce() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    (nanos as u64) ^ u64::from(std::process::id()).rotate_left(32)
}

async fn send(
    stream: &mut TcpStream,
    magic: Magic,
    payload: NetworkMessage,
) -> std::io::Result<()> {
    let bytes = serialize(&RawNetworkMessage::new(magic, payload));
    stream.write_all(&bytes).await
}

/// Reads one message; `None` for a message this listener does not understand (a node may
/// speak extensions rust-bitcoin does not know), which is skipped.
async fn read(stream: &mut TcpStream, magic: Magic) -> std::io::Result<Option<NetworkMessage>> {
    let mut header = [0u8; 24];
    stream.read_exact(&mut header).await?;
    if header[..4] != magic.to_bytes() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the peer speaks another network (message start differs)",
        ));
    }
    let length = u32::from_le_bytes(header[16..20].try_into().expect("4 bytes")) as usize;
    if length > MAX_MESSAGE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a {length}-byte message is over the limit"),
        ));
    }
    let mut message = header.to_vec();
    message.resize(24 + length, 0);
    stream.read_exact(&mut message[24..]).await?;
    Ok(deserialize::<RawNetworkMessage>(&message)
        .ok()
        .map(|raw| raw.into_payload()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use payrecon_chain_core::bitcoin::hashes::Hash as _;

    #[tokio::test]
    async fn a_handshake_then_an_announcement_wakes_the_scanner() {
        let magic = Magic::REGTEST;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = listener.local_addr().unwrap().to_string();
        let node = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let Some(NetworkMessage::Version(offered)) = read(&mut stream, magic).await.unwrap()
            else {
                panic!("the listener opens with its version");
            };
            assert!(offered.relay, "asks for transaction announcements");
            let mut ours = offered.clone();
            ours.user_agent = "/node/".into();
            send(&mut stream, magic, NetworkMessage::Version(ours))
                .await
                .unwrap();
            send(&mut stream, magic, NetworkMessage::Verack)
                .await
                .unwrap();
            send(&mut stream, magic, NetworkMessage::Ping(7))
                .await
                .unwrap();
            loop {
                if let Some(NetworkMessage::Pong(7)) = read(&mut stream, magic).await.unwrap() {
                    break;
                }
            }
            let txid = payrecon_chain_core::bitcoin::Txid::from_byte_array([1; 32]);
            send(
                &mut stream,
                magic,
                NetworkMessage::Inv(vec![Inventory::Transaction(txid)]),
            )
            .await
            .unwrap();
            stream
        });
        let channel = PushChannel::start(peer, magic);
        tokio::time::timeout(Duration::from_secs(10), channel.news())
            .await
            .expect("the announcement wakes the scanner");
        drop(node.await.unwrap());
    }
}
