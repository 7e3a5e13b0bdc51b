//! Headless Chromium (Debian's `chromium`) driven over the DevTools protocol: pages opened at
//! a given width, what a person sees read back, buttons pressed, screenshots kept under
//! `target/test-artifacts/` and QR codes in them decoded (the browser decodes the PNG).
//!
//! The protocol is JSON over a WebSocket, and these tests send eleven of its commands; they do
//! so over `tokio-tungstenite`, which the Ethereum client already builds. A full client crate
//! (chromiumoxide) generated bindings for the whole protocol and cost three minutes of every
//! clean build.
//!
//! Chromium comes from `PAYRECON_TEST_CHROMIUM` or `/usr/bin/chromium`; scripts/test.sh
//! installs it. Without it the browser tests fail: they are never skipped.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// Where Chromium is; fails the test when it is missing.
pub fn chromium() -> String {
    let path =
        std::env::var("PAYRECON_TEST_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        std::path::Path::new(&path).exists(),
        "the browser test needs Chromium at {path}: run scripts/test.sh, which installs Debian's chromium"
    );
    path
}

/// How every test starts Chromium: no window, no sandbox (tests may run as root), nothing
/// shared with another run.
pub const HEADLESS: [&str; 5] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
];

/// A screen a person reads the page on.
#[derive(Clone, Copy, Debug)]
pub struct Screen {
    pub name: &'static str,
    pub width: u32,
    pub height: u32,
    /// A phone: touch, mobile viewport rules, two device pixels per CSS pixel.
    pub phone: bool,
}

pub const DESKTOP: Screen = Screen {
    name: "desktop",
    width: 1280,
    height: 900,
    phone: false,
};
/// The smallest laptop screen finance works on.
pub const LAPTOP: Screen = Screen {
    name: "laptop",
    width: 1366,
    height: 768,
    phone: false,
};
pub const PHONE: Screen = Screen {
    name: "phone",
    width: 390,
    height: 844,
    phone: true,
};

/// How long one protocol command may take; a liveness bound, not a performance check.
const COMMAND_DEADLINE: Duration = Duration::from_secs(60);

type Replies = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Value, String>>>>>;

/// One DevTools connection: commands go out with an id, and a reader task hands each answer
/// to the command with that id. Events, which these tests do not need, are dropped.
struct DevTools {
    sink: tokio::sync::Mutex<SplitSink<WebSocketStream<MaybeTlsStream<TcpStream>>, Message>>,
    replies: Replies,
    next_id: AtomicU64,
    reader: tokio::task::JoinHandle<()>,
}

impl DevTools {
    async fn connect(url: &str) -> DevTools {
        let (socket, _) = tokio_tungstenite::connect_async(url)
            .await
            .unwrap_or_else(|e| panic!("DevTools at {url}: {e}"));
        let (sink, mut stream) = socket.split();
        let replies = Replies::default();
        let pending = replies.clone();
        let reader = tokio::spawn(async move {
            while let Some(Ok(message)) = stream.next().await {
                let Message::Text(text) = message else {
                    continue;
                };
                let answer: Value = serde_json::from_str(&text).expect("DevTools sends JSON");
                let Some(id) = answer["id"].as_u64() else {
                    continue;
                };
                let waiting = pending.lock().expect("never poisoned").remove(&id);
                if let Some(waiting) = waiting {
                    let _ = waiting.send(match answer.get("error") {
                        Some(error) => Err(error.to_string()),
                        None => Ok(answer["result"].clone()),
                    });
                }
            }
        });
        DevTools {
            sink: tokio::sync::Mutex::new(sink),
            replies,
            next_id: AtomicU64::new(1),
            reader,
        }
    }

    /// Sends `method` to the browser, or to the page of `session`, and waits for its result.
    async fn call(
        &self,
        session: Option<&str>,
        method: &str,
        params: Value,
    ) -> Result<Value, String> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        self.replies
            .lock()
            .expect("never poisoned")
            .insert(id, answer);
        let mut command = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            command["sessionId"] = session.into();
        }
        self.sink
            .lock()
            .await
            .send(Message::text(command.to_string()))
            .await
            .map_err(|e| format!("{method}: {e}"))?;
        tokio::time::timeout(COMMAND_DEADLINE, answered)
            .await
            .map_err(|_| format!("{method}: no answer within {COMMAND_DEADLINE:?}"))?
            .map_err(|_| format!("{method}: the browser closed the connection"))?
    }
}

/// One headless Chromium; [`Headless::close`] it, or it is killed when dropped.
pub struct Headless {
    devtools: Arc<DevTools>,
    process: tokio::process::Child,
    _profile: tempfile::TempDir,
}

/// A tab of [`Headless`].
pub struct Page {
    devtools: Arc<DevTools>,
    target: String,
    session: String,
}

impl Headless {
    pub async fn launch() -> Headless {
        let profile = tempfile::tempdir().unwrap();
        let process = tokio::process::Command::new(chromium())
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .args(HEADLESS)
            .args(["--hide-scrollbars", "--remote-debugging-port=0"])
            .arg(format!(
                "--window-size={},{}",
                DESKTOP.width, DESKTOP.height
            ))
            .arg("about:blank")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", chromium()));
        // Chromium writes the port it chose, and the browser's path, once it listens.
        let active_port = profile.path().join("DevToolsActivePort");
        let start = Instant::now();
        let url = loop {
            if let Ok(written) = std::fs::read_to_string(&active_port)
                && let Some((port, path)) = written.split_once('\n')
                && !path.trim().is_empty()
            {
                break format!("ws://127.0.0.1:{port}{}", path.trim());
            }
            assert!(
                start.elapsed() < COMMAND_DEADLINE,
                "Chromium did not open its DevTools port"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        Headless {
            devtools: Arc::new(DevTools::connect(&url).await),
            process,
            _profile: profile,
        }
    }

    /// A new blank tab.
    async fn tab(&self) -> Page {
        let created = self
            .devtools
            .call(None, "Target.createTarget", json!({ "url": "about:blank" }))
            .await
            .unwrap();
        let target = created["targetId"].as_str().unwrap().to_owned();
        let attached = self
            .devtools
            .call(
                None,
                "Target.attachToTarget",
                json!({ "targetId": target, "flatten": true }),
            )
            .await
            .unwrap();
        Page {
            devtools: self.devtools.clone(),
            target,
            session: attached["sessionId"].as_str().unwrap().to_owned(),
        }
    }

    /// A new tab showing `url` on `screen`, asking for `accept_language` if given.
    pub async fn open(&self, url: &str, screen: Screen, accept_language: Option<&str>) -> Page {
        let page = self.tab().await;
        emulate(&page, screen).await;
        if let Some(languages) = accept_language {
            let agent: String = evaluate(&page, "navigator.userAgent").await;
            page.call(
                "Emulation.setUserAgentOverride",
                json!({ "userAgent": agent, "acceptLanguage": languages }),
            )
            .await
            .unwrap();
        }
        let navigated = page
            .call("Page.navigate", json!({ "url": url }))
            .await
            .unwrap();
        assert!(
            navigated.get("errorText").is_none(),
            "opening {url}: {navigated}"
        );
        wait_until(
            &page,
            "document.readyState === 'complete' && location.href !== 'about:blank'",
            &format!("{url} to load"),
        )
        .await;
        page
    }

    /// Closes the browser and waits for it to exit.
    pub async fn close(mut self) {
        let _ = self.devtools.call(None, "Browser.close", json!({})).await;
        tokio::time::timeout(COMMAND_DEADLINE, self.process.wait())
            .await
            .expect("Chromium exits once closed")
            .unwrap();
    }
}

impl Drop for Headless {
    fn drop(&mut self) {
        self.devtools.reader.abort();
    }
}

impl Page {
    async fn call(&self, method: &str, params: Value) -> Result<Value, String> {
        self.devtools
            .call(Some(&self.session), method, params)
            .await
    }

    /// Presses the element `selector` finds as a person does: the pointer over its middle,
    /// pressed and released.
    pub async fn click(&self, selector: &str) {
        let (x, y): (f64, f64) = evaluate(
            self,
            &format!(
                "(() => {{ const e = document.querySelector({selector:?}); \
                 e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect(); \
                 return [r.left + r.width / 2, r.top + r.height / 2]; }})()"
            ),
        )
        .await;
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({ "type": kind, "x": x, "y": y, "button": "left", "clickCount": 1 }),
            )
            .await
            .unwrap();
        }
    }

    /// Closes the tab.
    pub async fn close(self) {
        self.devtools
            .call(
                None,
                "Target.closeTarget",
                json!({ "targetId": self.target }),
            )
            .await
            .unwrap();
    }
}

/// Lays `page` out for `screen`.
async fn emulate(page: &Page, screen: Screen) {
    page.call(
        "Emulation.setDeviceMetricsOverride",
        json!({
            "width": screen.width,
            "height": screen.height,
            "deviceScaleFactor": if screen.phone { 2.0 } else { 1.0 },
            "mobile": screen.phone,
        }),
    )
    .await
    .unwrap();
}

/// The value of a JavaScript expression on `page` (a promise is awaited), or why there is none.
async fn value_of(page: &Page, expression: &str) -> Result<Value, String> {
    let evaluated = page
        .call(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
        )
        .await?;
    match evaluated.get("exceptionDetails") {
        Some(thrown) => Err(thrown.to_string()),
        None => Ok(evaluated["result"]["value"].clone()),
    }
}

/// The value of a JavaScript expression on `page`.
pub async fn evaluate<T: DeserializeOwned>(page: &Page, expression: &str) -> T {
    let value = value_of(page, expression)
        .await
        .unwrap_or_else(|e| panic!("{expression}: {e}"));
    serde_json::from_value(value).unwrap_or_else(|e| panic!("{expression}: {e}"))
}

/// The text a person sees on the page (layout-aware: hidden elements are left out).
pub async fn visible_text(page: &Page) -> String {
    evaluate(page, "document.body.innerText").await
}

/// Waits up to a minute until `expression` is true on `page`; a liveness bound, not a
/// performance check.
pub async fn wait_until(page: &Page, expression: &str, what: &str) {
    let start = Instant::now();
    loop {
        // While a page loads there may be no document to ask yet: that is "not yet".
        if value_of(page, expression).await == Ok(Value::Bool(true)) {
            return;
        }
        assert!(
            start.elapsed() < COMMAND_DEADLINE,
            "timed out waiting for {what}; the page shows: {}",
            visible_text(page).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A full-page PNG screenshot of `page` on `screen`, kept as
/// `target/test-artifacts/<test>/<name>.png`.
pub async fn screenshot(page: &Page, screen: Screen, test: &str, name: &str) -> Vec<u8> {
    // The page is laid out as tall as its content for the capture, then put back on `screen`.
    let metrics = page.call("Page.getLayoutMetrics", json!({})).await.unwrap();
    let content = &metrics["cssContentSize"];
    let tall = Screen {
        width: content["width"].as_f64().unwrap().ceil() as u32,
        height: content["height"].as_f64().unwrap().ceil() as u32,
        ..screen
    };
    emulate(page, tall).await;
    let captured = page
        .call("Page.captureScreenshot", json!({ "format": "png" }))
        .await
        .unwrap();
    emulate(page, screen).await;
    let png = BASE64.decode(captured["data"].as_str().unwrap()).unwrap();
    let dir = artifacts(test);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.png")), &png).unwrap();
    png
}

/// Where a test's artifacts are kept.
pub fn artifacts(test: &str) -> PathBuf {
    crate::common::repo_root()
        .join("target/test-artifacts")
        .join(test)
}

/// The image in a PNG decoded by the browser, as the luminance of each pixel, row by row.
const LUMINANCE: &str = r#"(async () => {
    const image = new Image();
    image.src = 'data:image/png;base64,PNG';
    await image.decode();
    const canvas = document.createElement('canvas');
    [canvas.width, canvas.height] = [image.naturalWidth, image.naturalHeight];
    const context = canvas.getContext('2d');
    context.drawImage(image, 0, 0);
    const rgba = context.getImageData(0, 0, canvas.width, canvas.height).data;
    const luma = new Uint8Array(canvas.width * canvas.height);
    for (let i = 0; i < luma.length; i++) {
        luma[i] = (rgba[4 * i] * 299 + rgba[4 * i + 1] * 587 + rgba[4 * i + 2] * 114) / 1000;
    }
    let bytes = '';
    for (let i = 0; i < luma.length; i += 8192) {
        bytes += String.fromCharCode.apply(null, luma.subarray(i, i + 8192));
    }
    return [canvas.width, canvas.height, btoa(bytes)];
})()"#;

impl Headless {
    /// The contents of every QR code in a PNG image. The browser decodes the image, in a blank
    /// tab of its own (no page's content policy applies there), and the codes are searched for
    /// in its pixels.
    pub async fn decode_qr_codes(&self, png: &[u8]) -> Vec<String> {
        let tab = self.tab().await;
        let encoded = BASE64.encode(png);
        let (width, height, luma): (usize, usize, String) =
            evaluate(&tab, &LUMINANCE.replace("PNG", &encoded)).await;
        tab.close().await;
        let luma = BASE64.decode(luma).unwrap();
        let mut image =
            rqrr::PreparedImage::prepare_from_greyscale(width, height, |x, y| luma[y * width + x]);
        image
            .detect_grids()
            .into_iter()
            .filter_map(|grid| grid.decode().ok().map(|(_, content)| content))
            .collect()
    }
}
