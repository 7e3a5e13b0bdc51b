//! A local HTTP server that replays recorded responses, in order, per path: the real
//! provider and chain clients talk to it as they would to the public APIs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::Response;

/// What the server answers once.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A status and a body.
    Body(u16, String),
    /// A recorded file from `fixtures/`.
    Fixture(&'static str),
}

type Script = Arc<Mutex<HashMap<String, (Vec<Reply>, usize)>>>;
type Hits = Arc<Mutex<HashMap<String, usize>>>;

/// A running replay server; each path answers its replies in order, then repeats the last.
pub struct ReplayServer {
    pub base_url: String,
    hits: Hits,
}

impl ReplayServer {
    pub async fn start(routes: Vec<(&str, Vec<Reply>)>) -> ReplayServer {
        let script: Script = Arc::new(Mutex::new(
            routes
                .into_iter()
                .map(|(path, replies)| (path.to_owned(), (replies, 0)))
                .collect(),
        ));
        let hits = Arc::new(Mutex::new(HashMap::new()));
        let app = Router::new()
            .fallback(answer)
            .with_state((script, hits.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        ReplayServer { base_url, hits }
    }

    /// How many requests reached `path`.
    pub fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

async fn answer(State((script, hits)): State<(Script, Hits)>, request: Request) -> Response {
    let path = request.uri().path().to_owned();
    *hits.lock().unwrap().entry(path.clone()).or_default() += 1;
    let reply = {
        let mut script = script.lock().unwrap();
        match script.get_mut(&path) {
            None => Reply::Body(404, "{\"error\":\"not found\"}".into()),
            Some((replies, next)) => {
                let reply = replies[(*next).min(replies.len() - 1)].clone();
                *next += 1;
                reply
            }
        }
    };
    let (status, body) = match reply {
        Reply::Body(status, body) => (status, body),
        Reply::Fixture(name) => (
            200,
            std::fs::read_to_string(format!("{}/fixtures/{name}", env!("CARGO_MANIFEST_DIR")))
                .unwrap(),
        ),
    };
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap())
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap()
}
