//! Headless Chromium (Debian's `chromium`) driven over the DevTools protocol: pages opened at
//! a given width, what a person sees read back, buttons pressed, screenshots kept under
//! `target/test-artifacts/` and QR codes in them decoded.
//!
//! Chromium comes from `PAYRECON_TEST_CHROMIUM` or `/usr/bin/chromium`; scripts/test.sh
//! installs it. Without it the browser tests fail: they are never skipped.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use chromiumoxide::cdp::browser_protocol::emulation::{
    SetDeviceMetricsOverrideParams, SetUserAgentOverrideParams,
};
use chromiumoxide::cdp::browser_protocol::page::CaptureScreenshotFormat;
use chromiumoxide::page::ScreenshotParams;
use chromiumoxide::{Browser, BrowserConfig, Page};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;

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

/// One headless Chromium; [`Headless::close`] it, or it is killed when dropped.
pub struct Headless {
    browser: Browser,
    handler: tokio::task::JoinHandle<()>,
    _profile: tempfile::TempDir,
}

impl Headless {
    pub async fn launch() -> Headless {
        let profile = tempfile::tempdir().unwrap();
        let config = BrowserConfig::builder()
            .chrome_executable(chromium())
            .user_data_dir(profile.path())
            .no_sandbox()
            .arg("--disable-gpu")
            .arg("--disable-dev-shm-usage")
            .arg("--no-first-run")
            .arg("--hide-scrollbars")
            .window_size(DESKTOP.width, DESKTOP.height)
            .build()
            .unwrap();
        let (browser, mut events) = Browser::launch(config).await.unwrap();
        // The protocol's messages must be read for any command to complete; one this crate
        // does not know is an error it reports and goes on from.
        let handler = tokio::spawn(async move { while events.next().await.is_some() {} });
        Headless {
            browser,
            handler,
            _profile: profile,
        }
    }

    /// A new tab showing `url` on `screen`, asking for `accept_language` if given.
    pub async fn open(&self, url: &str, screen: Screen, accept_language: Option<&str>) -> Page {
        let page = self.browser.new_page("about:blank").await.unwrap();
        emulate(&page, screen).await;
        if let Some(languages) = accept_language {
            let agent: String = evaluate(&page, "navigator.userAgent").await;
            page.execute(
                SetUserAgentOverrideParams::builder()
                    .user_agent(agent)
                    .accept_language(languages)
                    .build()
                    .unwrap(),
            )
            .await
            .unwrap();
        }
        page.goto(url).await.unwrap();
        page.wait_for_navigation().await.unwrap();
        page
    }
}

impl Headless {
    /// Closes the browser and waits for it to exit.
    pub async fn close(mut self) {
        self.browser.close().await.unwrap();
        self.browser.wait().await.unwrap();
    }
}

impl Drop for Headless {
    fn drop(&mut self) {
        self.handler.abort();
    }
}

/// Lays `page` out for `screen`.
async fn emulate(page: &Page, screen: Screen) {
    page.execute(
        SetDeviceMetricsOverrideParams::builder()
            .width(screen.width)
            .height(screen.height)
            .device_scale_factor(if screen.phone { 2.0 } else { 1.0 })
            .mobile(screen.phone)
            .build()
            .unwrap(),
    )
    .await
    .unwrap();
}

/// The value of a JavaScript expression on `page`.
pub async fn evaluate<T: DeserializeOwned>(page: &Page, expression: &str) -> T {
    page.evaluate(expression)
        .await
        .unwrap_or_else(|e| panic!("{expression}: {e}"))
        .into_value()
        .unwrap_or_else(|e| panic!("{expression}: {e}"))
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
        let holds = page
            .evaluate(expression)
            .await
            .ok()
            .and_then(|value| value.into_value::<bool>().ok())
            .unwrap_or(false);
        if holds {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}; the page shows: {}",
            visible_text(page).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A full-page PNG screenshot of `page` on `screen`, kept as
/// `target/test-artifacts/<test>/<name>.png`.
pub async fn screenshot(page: &Page, screen: Screen, test: &str, name: &str) -> Vec<u8> {
    let png = page
        .screenshot(
            ScreenshotParams::builder()
                .format(CaptureScreenshotFormat::Png)
                .full_page(true)
                .build(),
        )
        .await
        .unwrap();
    // A full-page capture resizes the page and then clears every size override.
    emulate(page, screen).await;
    let dir = artifacts(test);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.png")), &png).unwrap();
    png
}

/// Where a test's artifacts are kept.
pub fn artifacts(test: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target/test-artifacts")
        .join(test)
}

/// The contents of every QR code in a PNG image.
pub fn decode_qr_codes(png: &[u8]) -> Vec<String> {
    let mut decoder = png::Decoder::new(std::io::Cursor::new(png));
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
    let frame = reader.next_frame(&mut pixels).unwrap();
    let (width, height) = (frame.width as usize, frame.height as usize);
    let channels = frame.color_type.samples();
    let luma = |x: usize, y: usize| -> u8 {
        let at = (y * width + x) * channels;
        match channels {
            1 | 2 => pixels[at],
            _ => {
                let (r, g, b) = (
                    u32::from(pixels[at]),
                    u32::from(pixels[at + 1]),
                    u32::from(pixels[at + 2]),
                );
                ((r * 299 + g * 587 + b * 114) / 1000) as u8
            }
        }
    };
    let mut image = rqrr::PreparedImage::prepare_from_greyscale(width, height, luma);
    image
        .detect_grids()
        .into_iter()
        .filter_map(|grid| grid.decode().ok().map(|(_, content)| content))
        .collect()
}
