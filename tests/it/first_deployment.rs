//! docs/first-deployment.md as a newcomer follows it: the test mnemonic's account keys it
//! lists derive the first receive addresses it names (as `payrecon doctor` prints them), and
//! the checkout page is served over HTTPS through Caddy with deploy/caddy/Caddyfile, its live
//! status updating through the proxy.

use crate::common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::regtest::eventually;
use common::repo_root as root;
use common::serve::{free_port, serving};
use payrecon::{Config, Verdict};

/// The guide's table of the test mnemonic's keys: (network, account key, first address).
fn guide_keys() -> Vec<(String, String, String)> {
    let guide = std::fs::read_to_string(root().join("docs/first-deployment.md")).unwrap();
    let row = regex::Regex::new(r"(?m)^\| (\w+) \| `(\w+)` \| `(\w+)` \|$").unwrap();
    row.captures_iter(&guide)
        .map(|c| (c[1].to_owned(), c[2].to_owned(), c[3].to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_guides_keys_derive_the_first_addresses_it_names() {
    let keys = guide_keys();
    assert_eq!(
        keys.len(),
        4,
        "bitcoin, litecoin, ethereum and tron: {keys:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut toml = format!(
        "database_url = \"sqlite://{}\"\n[rates]\nsources = [\"recorded\"]\nrecorded_quotes_file = \"{}\"\n",
        dir.path().join("doctor.db").display(),
        root().join("fixtures/rates/recorded-quotes.json").display()
    );
    for (network, key, _) in &keys {
        toml.push_str(&format!(
            "[networks.{network}]\nxpub = \"{key}\"\nconfirmations = 2\n"
        ));
    }
    let config = Config::from_toml(&toml).unwrap();
    let checks = payrecon::doctor(&config).await;
    for (network, _, first) in &keys {
        let check = checks
            .iter()
            .find(|check| check.check == format!("{network} key"))
            .unwrap_or_else(|| panic!("doctor checks the {network} key: {checks:?}"));
        assert_eq!(check.verdict, Verdict::Ok, "{check:?}");
        assert!(
            check
                .detail
                .contains(&format!("first receive address is {first}:")),
            "{network}: the guide names {first}, doctor says {}",
            check.detail
        );
    }
}

/// Caddy run with the repository's Caddyfile for `site`, proxying to `upstream`, with its
/// internal certificate authority and ports of its own; killed when dropped.
struct Caddy {
    child: Child,
    https_port: u16,
    dir: tempfile::TempDir,
}

impl Caddy {
    fn start(site: &str, upstream: &str) -> Caddy {
        let dir = tempfile::tempdir().unwrap();
        let https_port = free_port();
        let config = dir.path().join("Caddyfile");
        std::fs::write(
            &config,
            format!(
                "{{\n\tlocal_certs\n\tskip_install_trust\n\tadmin off\n\thttp_port {}\n\thttps_port {https_port}\n\tstorage file_system {}\n}}\n\nimport {}\n",
                free_port(),
                dir.path().join("data").display(),
                root().join("deploy/caddy/Caddyfile").display()
            ),
        )
        .unwrap();
        let child = Command::new("caddy")
            .args(["run", "--adapter", "caddyfile", "--config"])
            .arg(&config)
            .env("PAYRECON_SITE", site)
            .env("PAYRECON_UPSTREAM", upstream)
            .env("HOME", dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(dir.path().join("caddy.log")).unwrap(),
            ))
            .spawn()
            .expect("caddy runs (scripts/test.sh installs Debian's caddy)");
        Caddy {
            child,
            https_port,
            dir,
        }
    }

    /// Caddy's root certificate, once it has made it.
    async fn root_certificate(&self) -> reqwest::Certificate {
        let path = self.dir.path().join("data/pki/authorities/local/root.crt");
        eventually("Caddy to make its certificate authority", || async {
            path.exists()
        })
        .await;
        reqwest::Certificate::from_pem(&std::fs::read(&path).unwrap()).unwrap()
    }
}

impl Drop for Caddy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_checkout_page_is_served_over_https_through_caddy_with_its_live_status() {
    let (config, serving, base) = serving("", "").await;
    let upstream = base.trim_start_matches("http://").to_owned();
    let caddy = Caddy::start("pay.test", &upstream);
    let https = reqwest::Client::builder()
        .add_root_certificate(caddy.root_certificate().await)
        .resolve("pay.test", ([127, 0, 0, 1], caddy.https_port).into())
        .build()
        .unwrap();
    let public = format!("https://pay.test:{}", caddy.https_port);
    eventually("the page to answer over HTTPS", || async {
        https
            .get(format!("{public}/health"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;

    let (intent, pay_to) = config.topup_and_pay("ltc");
    let checkout = config.cli(&["pay", "show", &intent])["checkout_path"]
        .as_str()
        .unwrap()
        .to_owned();
    let page = https
        .get(format!("{public}{checkout}"))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    assert!(
        page.text().await.unwrap().contains(&pay_to),
        "the page shows the address"
    );
    let metrics = https.get(format!("{public}/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), 404, "/metrics stays off the public name");

    let mut stream = https
        .get(format!("{public}{checkout}/events"))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let first = tokio::time::timeout(Duration::from_secs(30), stream.chunk())
        .await
        .expect("the first status arrives through the proxy")
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&first).contains("event: status"));
    config.cli(&["pay", "mark-paid", &intent]);
    let next = tokio::time::timeout(Duration::from_secs(30), stream.chunk())
        .await
        .expect("the change arrives through the proxy as it happens")
        .unwrap()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&next).contains("event: status"),
        "{}",
        String::from_utf8_lossy(&next)
    );
    drop(stream);
    serving.stop().await;
}
