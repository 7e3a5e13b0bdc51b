//! The alert rules and the dashboard that come with payrecon (`deploy/`): `promtool check
//! rules` and `promtool test rules` (Debian's `prometheus` package; scripts/test.sh installs
//! it), and every metric they name is one a real `/metrics` page serves.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use crate::common;
use common::TestDb;

fn deploy() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy"))
}

fn promtool(args: &[&str]) -> String {
    let output = Command::new("promtool")
        .args(args)
        .current_dir(deploy().join("prometheus"))
        .output()
        .expect("promtool (Debian's prometheus package) runs; scripts/test.sh installs it");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "promtool {args:?}: {said}");
    said
}

#[test]
fn the_alert_rules_load_and_each_fires_only_when_it_should() {
    assert!(promtool(&["check", "rules", "alerts.yml"]).contains("SUCCESS: 13 rules found"));
    promtool(&["test", "rules", "alerts_test.yml"]);
    // One firing and one silent case per alert.
    let rules = std::fs::read_to_string(deploy().join("prometheus/alerts.yml")).unwrap();
    let tests = std::fs::read_to_string(deploy().join("prometheus/alerts_test.yml")).unwrap();
    for alert in rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
    {
        assert_eq!(
            tests.matches(&format!("alertname: {alert}\n")).count(),
            2,
            "{alert}"
        );
        let anchor = format!("docs/operators.md#{}", alert.to_lowercase());
        assert!(rules.contains(&anchor), "{alert} links its runbook");
        let operators = std::fs::read_to_string(deploy().join("../docs/operators.md")).unwrap();
        assert!(
            operators.contains(&format!("### {alert}\n")),
            "docs/operators.md has {alert}'s runbook"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_rules_and_the_dashboard_name_only_metrics_payrecon_serves() {
    // The database lives as long as `db`: the engine's pool opens connections to it later.
    let db = TestDb::new(common::Db::Sqlite).await;
    let seeded = common::seed::seed(&db).await;
    let page = payrecon::test_utils::api::metrics_text(&seeded.engine)
        .await
        .unwrap();
    let served: BTreeSet<&str> = page
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .chain(["payrecon_live_statuses_open", "up"])
        .collect();
    let named = regex::Regex::new(r"\b(payrecon_[a-z_]+|up)\b").unwrap();
    for file in ["prometheus/alerts.yml", "grafana/payrecon.json"] {
        let text = std::fs::read_to_string(deploy().join(file)).unwrap();
        for metric in named.find_iter(&text).map(|m| m.as_str()) {
            assert!(
                served.contains(metric),
                "{file} names {metric}, which /metrics does not serve: {served:?}"
            );
        }
    }
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(deploy().join("grafana/payrecon.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(dashboard["panels"].as_array().unwrap().len(), 12);
}
