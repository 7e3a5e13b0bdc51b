//! The HTTP API over a seeded database, on SQLite and PostgreSQL: every role boundary,
//! malformed and oversized requests, unknown ids, the shop's flow, finance reports, operator
//! actions, metrics and health; and webhooks to a receiver that fails before it succeeds.

use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use chrono::Duration;
use common::seed::{Seeded, seed};
use payrecon::ApiOptions;
use payrecon::Role;
use payrecon::config::WebhookConfig;
use payrecon::test_utils::api::ServerLimits;
use payrecon::test_utils::webhooks::WebhookSender;
use payrecon::{EVENT_ID_HEADER, SIGNATURE_HEADER, SIGNATURE_TOLERANCE, verify_signature};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The body docs/shop.md shows under "An intent payrecon no longer knows".
fn guide_lost_intent_answer() -> Value {
    let guide = include_str!("../../docs/shop.md");
    let shown = guide
        .split("HTTP/1.1 404 Not Found\n")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        .expect("docs/shop.md shows the 404 of a lost intent");
    serde_json::from_str(shown).expect("the guide's example is JSON")
}

/// Whether two JSON documents have the same keys at every level and the same kind of value
/// under each.
fn same_shape(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len()
                && a.iter()
                    .all(|(key, value)| b.get(key).is_some_and(|other| same_shape(value, other)))
        }
        (Value::Array(_), Value::Array(_)) => true,
        _ => std::mem::discriminant(a) == std::mem::discriminant(b),
    }
}

/// The API served on a free local port, with a token per role.
struct Api {
    /// Held for the server's life: dropping it would end every live status.
    _stop: tokio::sync::watch::Sender<bool>,
    base: String,
    shop: String,
    finance: String,
    operator: String,
    http: reqwest::Client,
}

impl Api {
    async fn start(seeded: &Seeded) -> Api {
        common::regtest::init_logs();
        let engine = seeded.engine.clone();
        let options = ApiOptions {
            max_body_bytes: 4096,
            webhooks: [("shop".to_owned(), 72)].into(),
            ..ApiOptions::default()
        };
        let limits = ServerLimits {
            header_read_timeout: std::time::Duration::from_secs(5),
            max_connections: 64,
            drain: std::time::Duration::from_secs(1),
        };
        let (stop, address) = common::serve_api(&engine, options, limits).await;
        let base = format!("http://{address}");
        Api {
            _stop: stop,
            base,
            shop: engine
                .create_api_token("shop-backend", Role::Shop)
                .await
                .unwrap(),
            finance: engine
                .create_api_token("fiona", Role::Finance)
                .await
                .unwrap(),
            operator: engine
                .create_api_token("otto", Role::Operator)
                .await
                .unwrap(),
            http: reqwest::Client::new(),
        }
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> (StatusCode, Value) {
        let mut request = self
            .http
            .request(method.parse().unwrap(), format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn raw(
        &self,
        path: &str,
        token: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> (StatusCode, Value) {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(token)
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .unwrap();
        (response.status(), response.json().await.unwrap())
    }
}

fn error_code(body: &Value) -> &str {
    body["error"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("not a JSON error: {body}"))
}

on_both_databases! {
    async fn every_role_reaches_only_its_endpoints(db) {
        let seeded = seed(&db).await;
        let api = Api::start(&seeded).await;
        let t2 = seeded.intent("T2");
        let topup = json!({"reference": "T9", "account_id": "42", "amount_usd": "100"});
        let resolve = json!({"action": "dismiss", "reason": "x"});
        let cases: [(&str, String, Option<&Value>, Role); 8] = [
            ("POST", "/v1/topups".into(), Some(&topup), Role::Shop),
            ("GET", format!("/v1/payments/{t2}"), None, Role::Shop),
            ("GET", "/v1/balances/42".into(), None, Role::Shop),
            ("GET", "/v1/reports/reconcile?from=2026-12-01&to=2026-12-02".into(), None, Role::Finance),
            ("GET", "/v1/ledger/trial-balance".into(), None, Role::Finance),
            ("GET", "/v1/stuck".into(), None, Role::Operator),
            ("POST", "/v1/exceptions/unmatched:x/resolve".into(), Some(&resolve), Role::Operator),
            ("GET", "/v1/audit-log".into(), None, Role::Operator),
        ];
        for (method, path, body, allowed) in &cases {
            let (status, error) = api.call(method, path, None, *body).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path} without a token");
            assert_eq!(error_code(&error), "unauthorized");
            let (status, _) = api.call(method, path, Some("prt_forged"), *body).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED);
            for (role, token) in [(Role::Shop, &api.shop), (Role::Finance, &api.finance), (Role::Operator, &api.operator)] {
                let (status, body) = api.call(method, path, Some(token), *body).await;
                if role == *allowed {
                    assert_ne!(status, StatusCode::FORBIDDEN, "{method} {path} as {role}: {body}");
                    assert_ne!(status, StatusCode::UNAUTHORIZED);
                } else {
                    assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path} as {role}: {body}");
                    assert_eq!(error_code(&body), "forbidden");
                }
            }
        }
        // A revoked token opens nothing.
        seeded.engine.revoke_api_token("fiona").await.unwrap();
        let (status, _) = api.call("GET", "/v1/ledger/trial-balance", Some(&api.finance), None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }

    async fn the_shop_flow_and_every_bad_request(db) {
        let seeded = seed(&db).await;
        let api = Api::start(&seeded).await;
        let shop = Some(api.shop.as_str());
        let topup = json!({"reference": "T9", "account_id": "42", "amount_usd": "100"});
        let (status, body) = api.call("POST", "/v1/topups", shop, Some(&topup)).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        assert_eq!(body["created"], true);
        let (status, _) = api.call("POST", "/v1/topups", shop, Some(&topup)).await;
        assert_eq!(status, StatusCode::OK, "a retry finds the same top-up");
        let (status, body) = api.call("POST", "/v1/topups", shop, Some(&json!({"reference": "T9", "account_id": "42", "amount_usd": "500"}))).await;
        assert_eq!((status, error_code(&body)), (StatusCode::CONFLICT, "conflict"));
        let (status, body) = api.call("POST", "/v1/payments", shop, Some(&json!({"order": "T9", "method": "btc"}))).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let intent = body["id"].as_str().unwrap().to_owned();
        assert_eq!(body["amount_decimal"], "0.00125");
        let qr = api.http.get(format!("{}/v1/payments/{intent}/qr.svg", api.base)).bearer_auth(&api.shop).send().await.unwrap();
        assert_eq!(qr.headers()["content-type"], "image/svg+xml");
        assert!(qr.text().await.unwrap().contains("<svg"));
        let (status, body) = api.call("POST", &format!("/v1/payments/{intent}/mark-paid"), shop, None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(body["marked_paid_at"].is_string());
        let (status, body) = api.call("GET", "/v1/balances/42", shop, None).await;
        assert_eq!((status, body["available_usd"].as_str()), (StatusCode::OK, Some("1000.00")));
        let (status, body) = api.call("GET", "/v1/orders/T9", shop, None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["payments"].as_array().unwrap().len(), 1);
        let rental = json!({"reference": "R9", "account_id": "42", "gpu_model": "H100", "duration_days": 3, "lots": 1, "total_usd": "90"});
        let (status, body) = api.call("POST", "/v1/orders", shop, Some(&rental)).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let (status, body) = api.call("POST", "/v1/orders/R9/pay-from-balance", shop, None).await;
        assert_eq!((status, body["balance_after"].as_str()), (StatusCode::OK, Some("910.00")), "{body}");

        // Unknown ids.
        for path in ["/v1/orders/NOPE", "/v1/payments/pi_nope", "/v1/payments/pi_nope/qr.svg"] {
            let (status, body) = api.call("GET", path, shop, None).await;
            assert_eq!((status, error_code(&body)), (StatusCode::NOT_FOUND, "not_found"), "{path}");
        }
        let (status, body) = api.call("GET", "/v1/nothing-here", shop, None).await;
        assert_eq!((status, error_code(&body)), (StatusCode::NOT_FOUND, "not_found"));
        // The answer docs/shop.md shows for an intent lost in a restore, in its shape.
        let (_, body) = api.call("GET", "/v1/payments/pi_nope", shop, None).await;
        let shown = guide_lost_intent_answer();
        assert!(same_shape(&shown, &body), "docs/shop.md shows {shown}, the server answers {body}");
        assert_eq!(shown["error"]["code"], body["error"]["code"]);
        // Malformed input: each refused with a JSON error, nothing stored.
        let (status, body) = api.raw("/v1/topups", &api.shop, "application/json", b"{\"reference\": ".to_vec()).await;
        assert_eq!((status, error_code(&body)), (StatusCode::BAD_REQUEST, "malformed_json"));
        let (status, body) = api.raw("/v1/topups", &api.shop, "text/plain", b"{}".to_vec()).await;
        assert_eq!((status, error_code(&body)), (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"));
        let (status, body) = api.raw("/v1/topups", &api.shop, "application/json", vec![0xff, 0xfe, b'{']).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        let huge = format!("{{\"reference\": \"{}\"}}", "x".repeat(10_000));
        let (status, body) = api.raw("/v1/topups", &api.shop, "application/json", huge.into_bytes()).await;
        assert_eq!((status, error_code(&body)), (StatusCode::PAYLOAD_TOO_LARGE, "too_large"));
        let (status, body) = api.call("POST", "/v1/payments", shop, Some(&json!({"order": "T9", "method": "doge"}))).await;
        assert_eq!((status, error_code(&body)), (StatusCode::UNPROCESSABLE_ENTITY, "invalid"));
        let (status, _) = api.call("POST", "/v1/payments", shop, Some(&json!({"order": "T9", "method": "btc", "amount": "1"}))).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "unknown fields are refused");
        let (status, body) = api.call("POST", "/v1/topups", shop, Some(&json!({"reference": "x'; DROP TABLE orders;--", "account_id": "42", "amount_usd": "100"}))).await;
        assert_eq!((status, error_code(&body)), (StatusCode::UNPROCESSABLE_ENTITY, "invalid"));
        let (status, body) = api.call("POST", "/v1/topups", shop, Some(&json!({"reference": "T10", "account_id": "42", "amount_usd": "1e9"}))).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        let (status, _) = api.call("GET", "/v1/orders/T10", shop, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "nothing stored");
    }

    async fn finance_reports_and_operator_actions_over_http(db) {
        let seeded = seed(&db).await;
        let api = Api::start(&seeded).await;
        let finance = Some(api.finance.as_str());
        let (status, body) = api.call("GET", "/v1/reports/reconcile?from=2026-12-01&to=2026-12-02", finance, None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["transfers"].as_array().unwrap().len(), 9);
        let csv = api.http.get(format!("{}/v1/reports/reconcile?from=2026-12-01&to=2026-12-02&format=csv&section=summary", api.base))
            .bearer_auth(&api.finance).send().await.unwrap();
        assert_eq!(csv.headers()["content-type"], "text/csv; charset=utf-8");
        assert!(csv.text().await.unwrap().contains("btc,BTC,7,2,1,4,0.04375,"));
        for bad in ["from=yesterday&to=2026-12-02", "from=2026-12-02&to=2026-12-01", "to=2026-12-02", "from=2026-12-01&to=2026-12-02&method=doge", "from=2026-12-01&to=2026-12-02&format=pdf"] {
            let (status, body) = api.call("GET", &format!("/v1/reports/reconcile?{bad}"), finance, None).await;
            assert!(status == StatusCode::BAD_REQUEST || status == StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {status} {body}");
            error_code(&body);
        }
        let (status, body) = api.call("GET", "/v1/ledger/trial-balance", finance, None).await;
        assert_eq!((status, &body["sound"]), (StatusCode::OK, &json!(true)));

        let operator = Some(api.operator.as_str());
        let (status, body) = api.call("GET", "/v1/exceptions?open=true", operator, None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body.as_array().unwrap().len(), 6);
        // The same, page by page: each page names the next in a Link header, and together
        // they are the whole list, in order, each once.
        let mut paged = Vec::new();
        let mut next = Some("/v1/exceptions?open=true&limit=4".to_owned());
        while let Some(path) = next.take() {
            let response = api.http.get(format!("{}{path}", api.base)).bearer_auth(&api.operator).send().await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            next = response.headers().get("link").map(|link| {
                let link = link.to_str().unwrap();
                assert!(link.ends_with("; rel=\"next\""), "{link}");
                link.trim_start_matches('<').split('>').next().unwrap().to_owned()
            });
            paged.extend(response.json::<Vec<Value>>().await.unwrap());
        }
        assert_eq!(&Value::Array(paged), &body);
        for path in ["/v1/stuck?limit=2", "/v1/audit-log?limit=1", "/v1/exceptions?limit=0"] {
            assert_eq!(api.call("GET", path, operator, None).await.0, StatusCode::OK, "{path}");
        }
        for path in ["/v1/stuck?after=nonsense", "/v1/exceptions?after=x.y", "/v1/audit-log?after=-", "/v1/stuck?limit=x"] {
            let status = api.call("GET", path, operator, None).await.0;
            assert!(status == StatusCode::BAD_REQUEST || status == StatusCode::UNPROCESSABLE_ENTITY, "{path}: {status}");
        }
        // Replay names a configured endpoint, or nothing happens.
        let (status, body) = api.call("POST", "/v1/webhooks/nobody/replay", operator, Some(&json!({"from_seq": 1}))).await;
        assert_eq!((status, error_code(&body)), (StatusCode::NOT_FOUND, "not_found"), "{body}");
        let (status, body) = api.call("POST", "/v1/webhooks/shop/replay", operator, Some(&json!({"from_seq": 1}))).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let late = "paid_late:bitcoin:t4:0";
        let (status, body) = api.call("POST", &format!("/v1/exceptions/{late}/resolve"), operator, Some(&json!({"action": "dismiss", "reason": "x"}))).await;
        assert_eq!((status, error_code(&body)), (StatusCode::CONFLICT, "conflict"), "money cannot be dismissed");
        let (status, body) = api.call("POST", &format!("/v1/exceptions/{late}/resolve"), operator, Some(&json!({"action": "mark_refunded"}))).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "no reason, no refund txid: {body}");
        let (status, body) = api.call("POST", &format!("/v1/exceptions/{late}/resolve"), operator,
            Some(&json!({"action": "accept_as_paid", "reason": "the customer asked us to take it"}))).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let (status, body) = api.call("POST", "/v1/exceptions/nope/resolve", operator, Some(&json!({"action": "dismiss", "reason": "x"}))).await;
        assert_eq!((status, error_code(&body)), (StatusCode::NOT_FOUND, "not_found"));
        let (_, log) = api.call("GET", "/v1/audit-log", operator, None).await;
        assert_eq!(log[0]["actor"], "otto", "the token's name is who acted");
        assert_eq!(log[0]["action"], "accept_as_paid");
        let (status, stuck) = api.call("GET", "/v1/stuck", operator, None).await;
        assert_eq!(status, StatusCode::OK);
        assert!(stuck.as_array().unwrap().iter().any(|i| i["category"] == "exception"));
    }

    async fn support_finds_a_payment_by_transaction_address_reference_or_intent(db) {
        let seeded = seed(&db).await;
        let api = Api::start(&seeded).await;
        let find = |q: &str| format!("/v1/support/find?q={q}");
        let t1 = seeded.intents["T1"].clone();
        let txid = seeded.engine.transfers_for(&common::checks::order("T1")).await.unwrap()[0].id.txid.clone();

        // A transaction id: the transfer with its intent, order, exceptions and entries.
        let (status, found) = api.call("GET", &find(&txid), Some(&api.operator), None).await;
        assert_eq!(status, StatusCode::OK, "{found}");
        assert_eq!(found["found"], "transfers");
        let transfer = &found["transfers"][0];
        assert_eq!(transfer["intent"]["id"], t1.intent.id.as_str());
        assert_eq!(transfer["order"]["reference"], "T1");
        assert!(transfer["ledger_entries"][0]["idempotency_key"].as_str().unwrap().starts_with("settle:"), "{transfer}");

        // An address: its intent, its order and every transfer to it.
        let (status, found) = api.call("GET", &find(&t1.intent.pay_to), Some(&api.operator), None).await;
        assert_eq!(status, StatusCode::OK, "{found}");
        assert_eq!(found["found"], "address");
        assert_eq!(found["order"]["reference"], "T1");
        assert_eq!(found["transfers"].as_array().unwrap().len(), 1);

        // An unmatched transfer is found by its transaction, with no intent, and its exception.
        let (_, found) = api.call("GET", &find(common::seed::UNMATCHED_TXID), Some(&api.operator), None).await;
        assert_eq!(found["found"], "transfers");
        assert!(found["transfers"][0]["intent"].is_null());
        assert_eq!(found["transfers"][0]["exceptions"][0]["kind"], "unmatched");
        // ... and by the address it paid, which no intent owns.
        let stray = found["transfers"][0]["transfer"]["to_address"].as_str().unwrap().to_owned();
        let (_, found) = api.call("GET", &find(&stray), Some(&api.operator), None).await;
        assert_eq!(found["found"], "address");
        assert!(found["intent"].is_null());
        assert_eq!(found["transfers"][0]["intent_id"], Value::Null);

        // A reference: the order as `order show` gives it; an intent id: the intent and that.
        let (_, found) = api.call("GET", &find("T3"), Some(&api.operator), None).await;
        assert_eq!((found["found"].as_str(), found["reference"].as_str()), (Some("order"), Some("T3")));
        assert_eq!(found["exceptions"][0]["kind"], "overpaid");
        let (_, found) = api.call("GET", &find(&t1.intent.id), Some(&api.operator), None).await;
        assert_eq!(found["found"], "intent");
        assert_eq!(found["order"]["reference"], "T1");

        // Nothing known: 404. Hostile or empty text: 422 or 400, and nothing is written.
        let (status, body) = api.call("GET", &find("nothing-here"), Some(&api.operator), None).await;
        assert_eq!((status, error_code(&body)), (StatusCode::NOT_FOUND, "not_found"));
        let before = seeded.engine.trial_balance().await.unwrap().entries;
        for hostile in ["x%27%20OR%20%271%27%3D%271", "%3Cscript%3E", "", &"a".repeat(200)] {
            let (status, body) = api.call("GET", &find(hostile), Some(&api.operator), None).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{hostile}: {body}");
        }
        let (status, _) = api.call("GET", "/v1/support/find", Some(&api.operator), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "q is required");
        assert_eq!(seeded.engine.trial_balance().await.unwrap().entries, before);

        // Operators only.
        for token in [&api.shop, &api.finance] {
            let (status, _) = api.call("GET", &find("T1"), Some(token), None).await;
            assert_eq!(status, StatusCode::FORBIDDEN);
        }
        let (status, _) = api.call("GET", &find("T1"), None, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }

    async fn an_accounts_history_pages_through_its_own_orders_payments_and_balance_only(db) {
        let seeded = seed(&db).await;
        // Neighbours whose ids share a prefix with 42's see nothing of each other.
        for (reference, account) in [("N1", "420"), ("N2", "4")] {
            seeded.engine.create_topup(&common::topup(reference, account, "100")).await.unwrap();
        }
        let api = Api::start(&seeded).await;
        let mut items = Vec::new();
        let mut after: Option<String> = None;
        let mut pages = 0;
        loop {
            let path = match &after {
                Some(next) => format!("/v1/accounts/42/history?limit=3&after={next}"),
                None => "/v1/accounts/42/history?limit=3".to_owned(),
            };
            let (status, page) = api.call("GET", &path, Some(&api.shop), None).await;
            assert_eq!(status, StatusCode::OK, "{page}");
            let page_items = page["items"].as_array().unwrap();
            assert!(page_items.len() <= 3);
            items.extend(page_items.iter().cloned());
            pages += 1;
            match page["next"].as_str() {
                Some(next) => after = Some(next.to_owned()),
                None => break,
            }
        }
        assert!(pages > 3, "paged");
        let times: Vec<&str> = items.iter().map(|i| i["at"].as_str().unwrap()).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "oldest first: {times:?}");
        let count = |kind: &str| items.iter().filter(|i| i["type"] == kind).count();
        let orders: Vec<&str> = items.iter().filter(|i| i["type"] == "order").map(|i| i["reference"].as_str().unwrap()).collect();
        for reference in ["T1", "T2", "T3", "T4", "T5", "T6", "T7", "T8"] {
            assert_eq!(orders.iter().filter(|r| **r == reference).count(), 1, "{reference} once: {orders:?}");
        }
        assert!(count("payment") >= seeded.intents.len());
        assert!(items.iter().all(|i| i["account_id"].is_null() || i["account_id"] == "42"));
        assert!(!items.iter().any(|i| i["reference"] == "N1" || i["reference"] == "N2"));
        // The statement's running balance ends at what the customer can spend.
        let last = items.iter().rev().find(|i| i["type"] == "balance").expect("a balance movement");
        let (_, balance) = api.call("GET", "/v1/balances/42", Some(&api.shop), None).await;
        assert_eq!(last["balance_usd"], balance["available_usd"]);

        let (_, other) = api.call("GET", "/v1/accounts/420/history", Some(&api.shop), None).await;
        let refs: Vec<&str> = other["items"].as_array().unwrap().iter().filter_map(|i| i["reference"].as_str()).collect();
        assert_eq!(refs, ["N1"], "its own order only");

        // Bad input: a clear 4xx; an e-mail is never an account id.
        for (path, expected) in [
            ("/v1/accounts/42/history?limit=0", StatusCode::UNPROCESSABLE_ENTITY),
            ("/v1/accounts/42/history?limit=100000", StatusCode::UNPROCESSABLE_ENTITY),
            ("/v1/accounts/42/history?limit=x", StatusCode::BAD_REQUEST),
            ("/v1/accounts/42/history?after=1.9.x", StatusCode::UNPROCESSABLE_ENTITY),
            ("/v1/accounts/42/history?after=%27%3B--", StatusCode::UNPROCESSABLE_ENTITY),
            ("/v1/accounts/42/history?sort=desc", StatusCode::BAD_REQUEST),
            ("/v1/accounts/bob%40example.com/history", StatusCode::UNPROCESSABLE_ENTITY),
        ] {
            let (status, body) = api.call("GET", path, Some(&api.shop), None).await;
            assert_eq!(status, expected, "{path}: {body}");
        }
        for token in [&api.finance, &api.operator] {
            let (status, _) = api.call("GET", "/v1/accounts/42/history", Some(token), None).await;
            assert_eq!(status, StatusCode::FORBIDDEN);
        }
        let (status, _) = api.call("GET", "/v1/accounts/42/history", None, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }

    async fn health_metrics_and_the_openapi_description(db) {
        let seeded = seed(&db).await;
        let api = Api::start(&seeded).await;
        assert_eq!(api.call("GET", "/health", None, None).await.0, StatusCode::OK);
        assert_eq!(api.call("GET", "/ready", None, None).await.0, StatusCode::OK);
        let metrics = api.http.get(format!("{}/metrics", api.base)).send().await.unwrap().text().await.unwrap();
        assert!(metrics.contains("# TYPE payrecon_intents gauge"));
        assert!(metrics.contains("payrecon_exceptions_open{kind=\"underpaid\"} 1"), "{metrics}");
        let (status, spec) = api.call("GET", "/openapi.json", None, None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(spec["openapi"], "3.1.0");
        for path in ["/v1/orders", "/v1/topups", "/v1/payments", "/v1/payments/{intent}/qr.svg", "/v1/payments/{intent}/mark-paid",
            "/v1/orders/{reference}/pay-from-balance", "/v1/balances/{account}", "/v1/reports/reconcile", "/v1/stuck",
            "/v1/exceptions/{id}/resolve", "/v1/audit-log", "/v1/webhooks/{endpoint}/replay", "/metrics", "/ready",
            "/v1/periods/{period}/close", "/v1/periods/{period}/reopen", "/v1/exports/journal", "/v1/reports/rollforward",
            "/v1/holdings", "/v1/wallet/{network}/export", "/v1/reports/holdings", "/v1/refunds",
            "/v1/exceptions/{id}/refunds", "/v1/refunds/{id}/approve", "/v1/refunds/{id}/cancel"] {
            assert!(spec["paths"][path].is_object(), "{path} is described");
        }
        let page = api.http.get(format!("{}/ui/stuck", api.base)).send().await.unwrap().text().await.unwrap();
        assert!(page.contains("Stuck payments"));
        seeded.engine.store().close().await;
        let (status, body) = api.call("GET", "/ready", None, None).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body["error"]["message"], "database unreachable", "the driver's words stay in the log");
    }

    async fn operators_record_refunds_over_http_and_webhooks_tell_the_shop(db) {
        let seeded = seed(&db).await;
        let api = Api::start(&seeded).await;
        let operator = Some(api.operator.as_str());
        let overpaid = seeded.engine.exceptions(None).await.unwrap().into_iter().find(|e| e.kind == "overpaid").unwrap();
        let path = format!("/v1/exceptions/{}/refunds", overpaid.id);
        let (status, _) = api.call("POST", &path, Some(api.shop.as_str()), Some(&json!({"address": "bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kv8f3t4"}))).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "operators' work");
        let (status, body) = api.call("POST", &path, operator, Some(&json!({"address": "0x52908400098527886E0F7030069857D2E4169EE7"}))).await;
        assert_eq!((status, error_code(&body)), (StatusCode::UNPROCESSABLE_ENTITY, "invalid"), "{body}");
        let (status, refund) = api.call("POST", &path, operator, Some(&json!({"address": "bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kv8f3t4", "amount": "overpaid"}))).await;
        assert_eq!(status, StatusCode::OK, "{refund}");
        assert_eq!((refund["state"].as_str(), refund["amount_decimal"].as_str()), (Some("requested"), Some("0.00075")));
        let id = refund["id"].as_str().unwrap();
        let (status, approved) = api.call("POST", &format!("/v1/refunds/{id}/approve"), operator, None).await;
        assert_eq!((status, approved["state"].as_str()), (StatusCode::OK, Some("approved")), "{approved}");
        let (status, body) = api.call("POST", "/v1/refunds/rf_nothing/approve", operator, None).await;
        assert_eq!((status, error_code(&body)), (StatusCode::NOT_FOUND, "not_found"));
        let (status, listed) = api.call("GET", &format!("/v1/refunds?exception={}", overpaid.id), operator, None).await;
        assert_eq!((status, listed.as_array().map(Vec::len)), (StatusCode::OK, Some(1)), "{listed}");
        let events = seeded.engine.events_after(0, 1000).await.unwrap();
        let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).filter(|k| k.starts_with("refund_")).collect();
        assert_eq!(kinds, ["refund_requested", "refund_approved"]);
        let approved_event = events.iter().find(|e| e.kind == "refund_approved").unwrap();
        assert_eq!(approved_event.detail["refund"], id);
        assert_eq!(approved_event.order_ref.as_deref(), overpaid.order_ref.as_deref());
    }

    async fn finance_reads_holdings_and_the_wallet_export_over_http(db) {
        let seeded = seed(&db).await;
        let api = Api::start(&seeded).await;
        let (finance, shop) = (Some(api.finance.as_str()), Some(api.shop.as_str()));
        let (status, _) = api.call("GET", "/v1/holdings", shop, None).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        let (status, holdings) = api.call("GET", "/v1/holdings?sort=index&limit=5", finance, None).await;
        assert_eq!(status, StatusCode::OK, "{holdings}");
        assert!(holdings["totals"].is_array() && holdings["addresses"].is_array(), "{holdings}");
        let (status, body) = api.call("GET", "/v1/holdings?sort=size", finance, None).await;
        assert_eq!((status, error_code(&body)), (StatusCode::UNPROCESSABLE_ENTITY, "invalid"), "{body}");
        let (status, body) = api.call("GET", "/v1/holdings?offset=-1", finance, None).await;
        assert_eq!((status, error_code(&body)), (StatusCode::BAD_REQUEST, "invalid_query"), "{body}");
        let (status, export) = api.call("GET", "/v1/wallet/bitcoin/export", finance, None).await;
        assert_eq!(status, StatusCode::OK, "{export}");
        assert!(export["receive_descriptor"].as_str().unwrap().starts_with("wpkh("), "{export}");
        assert!(export["change_descriptor"].as_str().unwrap().contains("/1/*)#"), "{export}");
        let (status, rollforward) = api.call("GET", "/v1/reports/holdings?period=2026-11", finance, None).await;
        assert_eq!(status, StatusCode::OK, "{rollforward}");
        assert_eq!(rollforward["closes"], true, "{rollforward}");
        let (status, _) = api.call("GET", "/v1/reports/holdings?period=2026-13", finance, None).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        for network in ["ethereum", "dogecoin"] {
            let (status, body) = api.call("GET", &format!("/v1/wallet/{network}/export"), finance, None).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        }
    }

    async fn finance_closes_months_and_downloads_journals_over_http(db) {
        let seeded = seed(&db).await;
        let api = Api::start(&seeded).await;
        assert_eq!(seeded.engine.value_entries().await.unwrap().failed, 0);
        let (finance, shop) = (Some(api.finance.as_str()), Some(api.shop.as_str()));

        let (status, _) = api.call("POST", "/v1/periods/2026-11/close", shop, None).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "only finance closes a month");
        let (status, closed) = api.call("POST", "/v1/periods/2026-11/close", finance, None).await;
        assert_eq!(status, StatusCode::OK, "{closed}");
        assert_eq!(closed["period"], "2026-11");
        let (status, again) = api.call("POST", "/v1/periods/2026-11/close", finance, None).await;
        assert_eq!((status, again["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("conflict")));
        let (_, state) = api.call("GET", "/v1/periods/2026-11", finance, None).await;
        assert_eq!(state["state"], "closed");
        assert_eq!(state["log"][0]["actor"], "fiona");
        let (status, _) = api.call("POST", "/v1/periods/2026-11/reopen", finance, Some(&json!({}))).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "a reopen needs a reason");
        let (status, reopened) = api.call("POST", "/v1/periods/2026-11/reopen", finance, Some(&json!({"reason": "late invoice"}))).await;
        assert_eq!((status, reopened["state"].as_str()), (StatusCode::OK, Some("open")));
        let (status, _) = api.call("POST", "/v1/periods/2026-13/close", finance, None).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

        let (status, rollforward) = api.call("GET", "/v1/reports/rollforward?period=2026-12", finance, None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(rollforward["closes"], true);
        assert_eq!(rollforward["closing"], rollforward["customer_balances"]);
        let (_, unvalued) = api.call("GET", "/v1/books/unvalued", finance, None).await;
        assert_eq!(unvalued["count"], 0);
        let (status, report) = api.call("GET", "/v1/periods/2026-12/report", finance, None).await;
        assert_eq!(status, StatusCode::OK);
        assert!(report["entries"].as_u64().unwrap() > 0);

        let download = api.http.get(format!("{}/v1/exports/journal?period=2026-12&format=generic", api.base))
            .bearer_auth(&api.finance).send().await.unwrap();
        assert_eq!(download.status(), StatusCode::OK);
        assert_eq!(download.headers()["content-type"], "text/csv; charset=utf-8");
        assert_eq!(download.headers()["content-disposition"], "attachment; filename=\"journal-2026-12.csv\"");
        let csv = download.text().await.unwrap();
        assert!(csv.starts_with("entry_id,seq,date,kind,account,gl_account,debit,credit,currency,"));
        assert!(csv.lines().skip(1).all(|line| line.starts_with("PR-")), "{csv}");
        assert!(csv.lines().count() > report["entries"].as_u64().unwrap() as usize, "a row per leg");
        let (status, body) = api.call("GET", "/v1/exports/journal?period=2026-12&format=pdf", finance, None).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        let (status, _) = api.call("GET", "/v1/exports/journal?period=2026-12&format=generic&part=2", finance, None).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "only Xero has parts");
        let (status, _) = api.call("GET", "/v1/exports/journal?period=2026-12", shop, None).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
    }

    async fn webhooks_arrive_in_order_exactly_once_through_failures(db) {
        let seeded = seed(&db).await;
        let engine = &seeded.engine;
        let secret = "a-very-secret-webhook-key";
        let received = Arc::new(Mutex::new(Vec::<(String, Value, u16)>::new()));
        let calls = Arc::new(Mutex::new(0u32));
        let (state, count) = (received.clone(), calls.clone());
        let receiver = axum::Router::new().route("/hook", axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let (state, count) = (state.clone(), count.clone());
                async move {
                    let n = { let mut c = count.lock().unwrap(); *c += 1; *c };
                    let signed = headers[SIGNATURE_HEADER].to_str().unwrap();
                    assert_eq!(verify_signature(secret, signed, &body, chrono::Utc::now().timestamp(), SIGNATURE_TOLERANCE), Ok(()), "signed over the timestamp and the body");
                    let event: Value = serde_json::from_slice(&body).unwrap();
                    assert_eq!(headers[EVENT_ID_HEADER].to_str().unwrap(), event["id"].as_str().unwrap());
                    // Fails, times out and answers 500 before it answers 200.
                    let status = match n {
                        1 | 3 => 500,
                        2 => { tokio::time::sleep(std::time::Duration::from_millis(1500)).await; 200 }
                        _ => 200,
                    };
                    state.lock().unwrap().push((event["id"].as_str().unwrap().to_owned(), event, status));
                    axum::http::StatusCode::from_u16(status).unwrap()
                }
            }));
        // First the receiver is not even listening: connection refused.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        drop(listener);
        let endpoint = WebhookConfig { name: "shop".into(), url: format!("http://{address}/hook").into(), secret: secret.into(), retry_hours: 72, timeout_ms: 500, allow_plain_http: true };
        let sender = WebhookSender::new(engine.clone(), vec![endpoint.clone()]).unwrap();
        sender.pass().await.unwrap();
        assert!(received.lock().unwrap().is_empty());
        let listener = tokio::net::TcpListener::bind(address).await.unwrap();
        tokio::spawn(async move { axum::serve(listener, receiver).await.unwrap() });

        let all = engine.events_after(0, 10_000).await.unwrap();
        for _ in 0..60 {
            seeded.clock.advance(Duration::hours(1));
            sender.pass().await.unwrap();
            let delivered = engine.webhook_counts().await.unwrap();
            if delivered == [("shop".to_owned(), "delivered".to_owned(), all.len() as i64)] {
                break;
            }
        }
        assert_eq!(engine.webhook_counts().await.unwrap(), [("shop".to_owned(), "delivered".to_owned(), all.len() as i64)]);
        let received = received.lock().unwrap().clone();
        let accepted: Vec<&(String, Value, u16)> = received.iter().filter(|(_, _, status)| *status == 200).collect();
        let mut ids: Vec<&str> = accepted.iter().map(|(id, _, _)| id.as_str()).collect();
        let before = ids.len();
        ids.dedup();
        let unique: std::collections::BTreeSet<&str> = received.iter().map(|(id, _, _)| id.as_str()).collect();
        assert_eq!(unique.len(), all.len(), "every event arrived");
        assert!(before >= all.len(), "the timed-out one may arrive twice; receivers deduplicate by id");
        // In order per intent: each intent's events were answered 200 in stream order.
        let mut per_intent: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        let mut seen = std::collections::BTreeSet::new();
        for (id, event, _) in &accepted {
            if seen.insert(id.clone()) {
                let seq: i64 = id.trim_start_matches("evt_").parse().unwrap();
                per_intent.entry(event["intent_id"].as_str().unwrap_or("none").to_owned()).or_default().push(seq);
            }
        }
        for (intent, seqs) in &per_intent {
            assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{intent}: {seqs:?}");
        }
        let first = &received.iter().find(|(id, _, _)| id == "evt_1").unwrap().1;
        assert_eq!(first["type"], "intent_created");

        // An operator replays from event 1: everything goes out again, with the same ids.
        let calls_before = *calls.lock().unwrap();
        assert_eq!(engine.replay_webhooks("shop", 1, 72).await.unwrap(), all.len() as u64);
        sender.pass().await.unwrap();
        assert_eq!(*calls.lock().unwrap() - calls_before, all.len() as u32);
        assert_eq!(engine.webhook_counts().await.unwrap(), [("shop".to_owned(), "delivered".to_owned(), all.len() as i64)]);
    }
}
