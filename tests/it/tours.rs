//! The shop guide's walkthroughs run as written (common/tour.rs says how): the CLI without a
//! server, and the HTTP tour against the devnet.

use crate::common;

use common::tour::{Tour, root, tour_lines};

// docs/shop.md, "Run it": from a folder holding the guide's example configuration (so that
// `> pay.svg` writes there), on this test's database.
on_both_databases! {
    async fn the_shop_cli_tour_runs_as_written(db) {
        let lines = tour_lines("docs/shop.md", "shop-cli");
        assert!(lines.len() >= 9, "{lines:?}");
        let cwd = tempfile::tempdir().unwrap();
        for shared in ["payrecon.offline.toml", "fixtures"] {
            std::os::unix::fs::symlink(root().join(shared), cwd.path().join(shared)).unwrap();
        }
        let mut tour = Tour::start(cwd.path(), &[("PAYRECON_DATABASE_URL", &db.url)], &[]);
        for line in &lines {
            tour.step(line);
        }
        assert!(cwd.path().join("pay.svg").exists(), "the QR code was written where the guide says");
    }
}

// docs/shop.md, "Try it in five minutes": against the devnet, on a chain of its own (the
// guide's devnet.toml names the first; the environment points it at this test's), a port
// of its own for the guide's 8080, a fresh key so that no earlier run's payment is found.
on_both_databases! {
    async fn the_shop_http_tour_runs_as_written(db) {
        let lines = tour_lines("docs/shop.md", "shop-http");
        assert!(lines.len() >= 12, "{lines:?}");
        let chain = common::regtest::Chain::lock().await;
        let port = common::serve::free_port();
        let key = common::regtest::fresh_account_xpub();
        let env = [
            ("PAYRECON_DATABASE_URL", db.url.as_str()),
            ("PAYRECON_HTTP__LISTEN", &format!("127.0.0.1:{port}")),
            ("PAYRECON_NETWORKS__LITECOIN__ELECTRUM_URL", &chain.electrum_url),
            ("PAYRECON_NETWORKS__LITECOIN__XPUB", &key),
            ("DEVNET_LANE", &chain.lane.to_string()),
        ];
        let mut tour = Tour::start(&root(), &env, &[("localhost:8080", &format!("localhost:{port}"))]);
        for line in &lines {
            tour.step(line);
            if line.contains(" serve &") {
                // The reader's next request waits for the server, as a reader would.
                common::regtest::eventually("payrecon serve to answer", || async {
                    reqwest::get(format!("http://127.0.0.1:{port}/ready"))
                        .await
                        .is_ok_and(|r| r.status().is_success())
                })
                .await;
            }
        }
        drop(tour);
        drop(chain);
    }
}
