//! What the witnesses said of each receipt: the state that holds a receipt below its
//! network's confirmations until every witness holds it.

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

/// The checks recorded for `ids` (all of one network), those that exist.
pub(crate) async fn checks_of(
    conn: &mut AnyConnection,
    ids: &[&TransferId],
) -> Result<Vec<WitnessCheck>, StoreError> {
    let mut found = Vec::new();
    for id in ids {
        let row = sqlx::query(
            "SELECT state, first_asked_ms, detail FROM witness_checks \
             WHERE network = $1 AND txid = $2 AND position = $3",
        )
        .bind(id.network.as_str())
        .bind(id.txid.as_str())
        .bind(i64::from(id.position))
        .fetch_optional(&mut *conn)
        .await?;
        if let Some(row) = row {
            found.push(WitnessCheck {
                id: (*id).clone(),
                state: WitnessState::parse(&row.try_get::<String, _>("state")?)?,
                first_asked_ms: row.try_get("first_asked_ms")?,
                detail: row.try_get("detail")?,
            });
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
