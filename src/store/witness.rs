//! What the witnesses said of each receipt: the state that holds a receipt below its
//! network's confirmations until every witness holds it.

use std::collections::HashSet;

use payrecon_chain_core::{Network, TransferId};
use sqlx::{AnyConnection, Row};

use super::StoreError;

/// Where a receipt stands with its witnesses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WitnessState {
    /// Asked, not every witness holds it yet: held, and asked again.
    Waiting,
    /// A witness contradicts the source, or stayed silent past the wait under `hold`: held
    /// as a `sources_disagree` exception, and still asked again.
    Disagrees,
    /// Every witness holds it: credited as any receipt.
    Confirmed,
    /// Credited without every witness, under `witness_policy = "warn"`.
    Unwitnessed,
}

impl WitnessState {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            WitnessState::Waiting => "waiting",
            WitnessState::Disagrees => "disagrees",
            WitnessState::Confirmed => "confirmed",
            WitnessState::Unwitnessed => "unwitnessed",
        }
    }

    fn parse(text: &str) -> Result<WitnessState, StoreError> {
        Ok(match text {
            "waiting" => WitnessState::Waiting,
            "disagrees" => WitnessState::Disagrees,
            "confirmed" => WitnessState::Confirmed,
            "unwitnessed" => WitnessState::Unwitnessed,
            other => {
                return Err(StoreError::Corrupt(format!(
                    "witness check state {other:?} is not one payrecon writes"
                )));
            }
        })
    }

    /// Whether the receipt may be credited.
    pub(crate) fn releases(self) -> bool {
        matches!(self, WitnessState::Confirmed | WitnessState::Unwitnessed)
    }
}

/// One receipt's witness check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WitnessCheck {
    pub(crate) id: TransferId,
    pub(crate) state: WitnessState,
    /// When the witnesses were first asked, on the engine's clock: the wait starts there.
    pub(crate) first_asked_ms: i64,
    /// What the witnesses answered last, for operators.
    pub(crate) detail: String,
}

/// The checks recorded for `ids` (all of one network), those that exist: one statement per
/// few hundred transactions, as `payments::transfers_by_ids` reads transfers.
pub(crate) async fn checks_of(
    conn: &mut AnyConnection,
    ids: &[&TransferId],
) -> Result<Vec<WitnessCheck>, StoreError> {
    let Some(network) = ids.first().map(|id| id.network) else {
        return Ok(Vec::new());
    };
    let wanted: HashSet<&TransferId> = ids.iter().copied().collect();
    let mut txids: Vec<&str> = ids.iter().map(|id| id.txid.as_str()).collect();
    txids.sort_unstable();
    txids.dedup();
    let backend = super::backend_of_conn(conn);
    let mut found = Vec::new();
    for chunk in txids.chunks(super::rows_per_statement(1) - 1) {
        let sql = format!(
            "SELECT txid, position, state, first_asked_ms, detail FROM witness_checks \
             WHERE network = {} AND txid IN ({})",
            super::placeholder(backend, 1),
            super::list_placeholders_after(backend, 1, chunk.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(network.as_str());
        for txid in chunk {
            query = query.bind(*txid);
        }
        for row in query.fetch_all(&mut *conn).await? {
            let position: i64 = row.try_get("position")?;
            let id = TransferId {
                network,
                txid: row.try_get("txid")?,
                position: u32::try_from(position).map_err(|_| {
                    StoreError::Corrupt(format!("witness check position {position}"))
                })?,
            };
            if wanted.contains(&id) {
                found.push(WitnessCheck {
                    state: WitnessState::parse(&row.try_get::<String, _>("state")?)?,
                    first_asked_ms: row.try_get("first_asked_ms")?,
                    detail: row.try_get("detail")?,
                    id,
                });
            }
        }
    }
    Ok(found)
}

/// Records each check, replacing what was recorded of its receipt.
pub(crate) async fn put_checks(
    conn: &mut AnyConnection,
    checks: &[WitnessCheck],
    now_ms: i64,
) -> Result<(), StoreError> {
    for check in checks {
        sqlx::query(
            "INSERT INTO witness_checks (network, txid, position, state, first_asked_ms, updated_at_ms, detail) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (network, txid, position) DO UPDATE SET \
             state = excluded.state, first_asked_ms = excluded.first_asked_ms, updated_at_ms = excluded.updated_at_ms, detail = excluded.detail",
        )
        .bind(check.id.network.as_str())
        .bind(check.id.txid.as_str())
        .bind(i64::from(check.id.position))
        .bind(check.state.as_str())
        .bind(check.first_asked_ms)
        .bind(now_ms)
        .bind(check.detail.as_str())
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Receipts per network and state, for `/metrics`.
pub(crate) async fn counts(
    conn: &mut AnyConnection,
) -> Result<Vec<(Network, &'static str, i64)>, StoreError> {
    let rows = sqlx::query(
        "SELECT network, state, COUNT(*) AS n FROM witness_checks GROUP BY network, state \
         ORDER BY network, state",
    )
    .fetch_all(conn)
    .await?;
    let mut counts = Vec::with_capacity(rows.len());
    for row in rows {
        let network: String = row.try_get("network")?;
        let network: Network = network
            .parse()
            .map_err(|e| StoreError::Corrupt(format!("witness check network: {e}")))?;
        let state = WitnessState::parse(&row.try_get::<String, _>("state")?)?.as_str();
        counts.push((network, state, row.try_get("n")?));
    }
    Ok(counts)
}

/// What one round's witness step writes with its batch, in the same transaction.
#[derive(Debug, Default)]
pub(crate) struct Verdicts {
    /// Each asked receipt's check, as it stands now.
    pub(crate) checks: Vec<WitnessCheck>,
    /// `sources_disagree` exceptions to open: the receipt, and what each side said.
    pub(crate) disagreements: Vec<(TransferId, String)>,
    /// Receipts every witness now holds: their `sources_disagree` exception, if any, closes.
    pub(crate) confirmed: Vec<TransferId>,
}

impl Verdicts {
    /// Nothing to write.
    pub(crate) const NONE: &'static Verdicts = &Verdicts {
        checks: Vec::new(),
        disagreements: Vec::new(),
        confirmed: Vec::new(),
    };
}
