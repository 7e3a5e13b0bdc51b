//! The guides' walkthroughs run as written (common/tour.rs says how): the shop's CLI without a
//! server and its HTTP tour against the devnet, and the rehearsal of deploy.md's restore drill.

use crate::common;

use common::repo_root as root;
use common::tour::{Tour, tour_lines};

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
        let mut env = devnet_env(&chain, port);
        env.push(("PAYRECON_DATABASE_URL".into(), db.url.clone()));
        let mut tour = Tour::start(&root(), &env, &[("localhost:8080", &format!("localhost:{port}"))]);
        run(&mut tour, &lines, port).await;
        drop(tour);
        drop(chain);
    }
}

/// docs/deploy.md, the restore drill's rehearsal: in a copy of examples/ (whose SQLite files
/// the drill moves and replaces), on a devnet chain of its own, a port of its own, a fresh key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_restore_drill_rehearsal_runs_as_written() {
    let lines = tour_lines("docs/deploy.md", "restore-drill");
    let chain = common::regtest::Chain::lock().await;
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir(work.path().join("examples")).unwrap();
    std::fs::copy(
        root().join("examples/devnet.toml"),
        work.path().join("examples/devnet.toml"),
    )
    .unwrap();
    for shared in ["scripts", "fixtures"] {
        std::os::unix::fs::symlink(root().join(shared), work.path().join(shared)).unwrap();
    }
    let port = common::serve::free_port();
    let mut tour = Tour::start(work.path(), &devnet_env(&chain, port), &[]);
    run(&mut tour, &lines, port).await;
    drop(tour);
    assert!(
        work.path()
            .join("examples/lost/payrecon-devnet.db")
            .exists(),
        "the lost database was kept aside"
    );
    drop(chain);
}

/// What points the guide's devnet.toml at this test's chain and port, with a fresh key.
fn devnet_env(chain: &common::regtest::Chain, port: u16) -> Vec<(String, String)> {
    vec![
        ("PAYRECON_HTTP__LISTEN".into(), format!("127.0.0.1:{port}")),
        (
            "PAYRECON_NETWORKS__LITECOIN__ELECTRUM_URL".into(),
            chain.electrum_url.clone(),
        ),
        (
            "PAYRECON_NETWORKS__LITECOIN__XPUB".into(),
            common::regtest::fresh_account_xpub(),
        ),
        ("DEVNET_LANE".into(), chain.lane.to_string()),
    ]
}

/// Each line in turn; after one that starts `payrecon serve` in the background, the next waits
/// until it answers, as a reader would.
async fn run(tour: &mut Tour, lines: &[String], port: u16) {
    for line in lines {
        tour.step(line);
        if line.contains(" serve &") {
            common::regtest::eventually("payrecon serve to answer", || async {
                reqwest::get(format!("http://127.0.0.1:{port}/ready"))
                    .await
                    .is_ok_and(|r| r.status().is_success())
            })
            .await;
        }
    }
}
