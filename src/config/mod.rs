//! Configuration: built-in defaults, then a TOML file, then `PAYRECON_*` environment
//! variables, then command-line flags; each later source wins.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use payrecon_chain_core::{Method, Network, Secret, SecretUrl};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use crate::money::Usd;

/// The file read when no `--config` is given, if it exists.
pub const DEFAULT_CONFIG_FILE: &str = "payrecon.toml";

/// The database used when none is configured: a SQLite file in the working directory.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://payrecon.db";

/// What starts an environment variable that sets a configuration key: `PAYRECON_<KEY>`, a
/// nested key's parts joined by `__` (`PAYRECON_HTTP__LISTEN`).
pub const ENV_PREFIX: &str = "PAYRECON_";

/// CoinGecko's public API, asked when no other URL is configured.
pub const COINGECKO_URL: &str = "https://api.coingecko.com";

/// Kraken's public API, asked when no other URL is configured.
pub const KRAKEN_URL: &str = "https://api.kraken.com";

/// Addresses watched past each key's counter unless configured: the gap limit of BIP44 and of
/// Electrum's and Sparrow's wallets.
pub const DEFAULT_LOOKAHEAD: u32 = 20;

/// The widest look-ahead accepted: each address in it is derived and followed by the watcher.
pub const MAX_LOOKAHEAD: u32 = 10_000;

/// When a commit counts as done: what payrecon waits for before it answers.
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// A commit is on disk before it is acknowledged: SQLite `synchronous=FULL` (the WAL is
    /// synced at every commit), PostgreSQL `synchronous_commit` at least `on` (raised to `on`
    /// if the server says `off`; stronger settings such as `remote_apply` are kept). An
    /// address handed out or a credit reported survives a power loss.
    #[default]
    Full,
    /// Opt-in, faster, and unsafe on power loss: SQLite `synchronous=NORMAL`, PostgreSQL
    /// `synchronous_commit=off`. A crash of payrecon loses nothing, but an OS crash or power
    /// loss may roll back the last commits after they were acknowledged; an intent whose
    /// address a customer already holds can vanish and its index be handed out again.
    Relaxed,
}

/// What happens to money beyond what an intent asked, or that arrived after its deadline.
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CreditPolicy {
    /// Held in suspense for an operator (credit to balance or refund, by hand).
    #[default]
    Hold,
    /// Its USD value at the intent's locked rate is credited to the customer's balance.
    CreditBalance,
}

/// One step of a network's confirmation rule: payments of at least `min_usd` need
/// `confirmations`.
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfirmationTier {
    /// From this USD value up.
    #[cfg_attr(test, schemars(with = "String"))]
    pub min_usd: Usd,
    /// This many confirmations.
    pub confirmations: u32,
}

/// Everything payrecon reads at start.
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `sqlite://path` (embedded, the default) or `postgres://user@host/db` (production).
    #[cfg_attr(test, schemars(with = "String"))]
    pub database_url: SecretUrl,
    /// `full` (the default): every commit is on disk before payrecon answers. `relaxed` is an
    /// explicit opt-in that is faster and unsafe on power loss (see [`Durability`]).
    #[serde(default)]
    pub database_durability: Durability,
    /// Payment instructions and matching.
    #[serde(default)]
    pub payments: PaymentsConfig,
    /// Price sources.
    #[serde(default)]
    pub rates: RatesConfig,
    /// Per-network keys and confirmation rules; a method works only if its network is here.
    #[serde(default)]
    pub networks: NetworksConfig,
    /// The HTTP API and pages of `payrecon serve`.
    #[serde(default)]
    pub http: HttpConfig,
    /// Endpoints that receive every intent state change and exception.
    #[serde(default)]
    pub webhooks: Vec<WebhookConfig>,
    /// How `payrecon serve` processes share one database.
    #[serde(default)]
    pub serve: ServeConfig,
    /// What the shop sells: GPU kinds, durations, lots, top-up amounts.
    #[serde(default)]
    pub catalog: crate::catalog::Catalog,
    /// Finance's books: the reporting currency, the periods' time zone and the chart of
    /// accounts the journal exports map to.
    #[serde(default)]
    pub books: BooksConfig,
}

/// `[serve]`.
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServeConfig {
    /// On PostgreSQL, a network's watcher lease lasts this long unless renewed: another
    /// process takes over a dead or stalled holder's watcher within it.
    pub lease_seconds: u32,
    /// A lease holder none of whose watcher rounds completed for this long is stalled: it
    /// gives the lease up. Longer than the slowest scan (a first Electrum scan of many
    /// addresses takes minutes).
    pub stall_seconds: u32,
    /// After SIGTERM (or Ctrl-C), open requests, live statuses and the watchers' current round
    /// get this long to finish; then the process exits regardless.
    pub shutdown_seconds: u32,
    /// A watcher's scan that takes longer fails and is retried.
    pub scan_deadline_seconds: u32,
}

impl Default for ServeConfig {
    fn default() -> ServeConfig {
        ServeConfig {
            lease_seconds: 15,
            stall_seconds: 600,
            shutdown_seconds: 10,
            scan_deadline_seconds: 300,
        }
    }
}

/// `[http]`.
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Address `payrecon serve` listens on, e.g. `127.0.0.1:8080`; no HTTP server without it.
    pub listen: Option<String>,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// A client must send a request's headers within this long, and an idle connection is
    /// closed after it: a slow or silent client holds no connection longer.
    pub header_read_timeout_ms: u32,
    /// Every request but a live status must be answered within this long (503 after it).
    pub request_timeout_ms: u32,
    /// Open connections at most; more wait to be accepted.
    pub max_connections: usize,
    /// Open live-status streams at most, in all (503 past it: the page falls back to its
    /// countdown and a reload hint).
    pub max_streams: usize,
    /// Open live-status streams at most per client address (429 past it).
    pub max_streams_per_client: usize,
    /// A live-status stream ends after this long; the page connects again when it needs to.
    pub stream_lifetime_seconds: u32,
    /// "I have paid" at most once per this long per checkout key (429 sooner).
    pub paid_interval_seconds: u32,
    /// `/metrics` on an address of its own (e.g. `127.0.0.1:9464`) instead of the API's.
    pub metrics_listen: Option<String>,
    /// With it, `/metrics` asks for `Authorization: Bearer <metrics_token>`.
    #[cfg_attr(test, schemars(with = "Option<String>"))]
    pub metrics_token: Option<Secret>,
}

impl Default for HttpConfig {
    fn default() -> HttpConfig {
        HttpConfig {
            listen: None,
            max_body_bytes: 64 * 1024,
            header_read_timeout_ms: 10_000,
            request_timeout_ms: 30_000,
            max_connections: 16_384,
            max_streams: 10_000,
            max_streams_per_client: 16,
            stream_lifetime_seconds: 900,
            paid_interval_seconds: 10,
            metrics_listen: None,
            metrics_token: None,
        }
    }
}

/// `[[webhooks]]`: one receiving endpoint.
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// A stable name: deliveries are tracked per name.
    pub name: String,
    /// Where events are POSTed.
    #[cfg_attr(test, schemars(with = "String"))]
    pub url: SecretUrl,
    /// The HMAC-SHA256 key the receiver checks signatures with.
    #[cfg_attr(test, schemars(with = "String"))]
    pub secret: Secret,
    /// Hours a delivery is retried before it is abandoned (an operator can replay it).
    #[serde(default = "webhook_retry_hours")]
    pub retry_hours: u32,
    /// How long the receiver may take to answer, in milliseconds.
    #[serde(default = "webhook_timeout_ms")]
    pub timeout_ms: u32,
    /// Whether `payrecon doctor` accepts a plain `http://` URL (a receiver on this host);
    /// otherwise it fails the endpoint.
    #[serde(default)]
    pub allow_plain_http: bool,
}

fn webhook_retry_hours() -> u32 {
    72
}

fn webhook_timeout_ms() -> u32 {
    10_000
}

impl Default for Config {
    fn default() -> Config {
        Config {
            database_url: DEFAULT_DATABASE_URL.into(),
            database_durability: Durability::Full,
            payments: PaymentsConfig::default(),
            rates: RatesConfig::default(),
            networks: NetworksConfig::default(),
            http: HttpConfig::default(),
            webhooks: Vec::new(),
            serve: ServeConfig::default(),
            catalog: crate::catalog::Catalog::default(),
            books: BooksConfig::default(),
        }
    }
}

/// `[books]`.
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BooksConfig {
    /// A second currency every entry is valued in beside USD (`"EUR"`), or none.
    pub reporting_currency: Option<String>,
    /// The IANA time zone periods are calendar months in (`"Europe/Berlin"`).
    pub timezone: String,
    /// Ledger account (or pattern ending in `*`) to general-ledger account. The most specific
    /// match wins; `fx:gain_loss` is the difference between locked and market value.
    pub accounts: BTreeMap<String, GlAccount>,
    /// The DATEV header's consultant and client numbers and account length.
    pub datev: DatevConfig,
    /// Xero's tax rate name for journal lines (`"No VAT"`, `"Tax Exempt"`).
    pub xero_tax_rate: String,
    /// How the Xero organisation's region writes dates: `day_first` (dd/mm/yyyy, the UK,
    /// Australia, New Zealand) or `month_first` (mm/dd/yyyy, the US).
    pub xero_date_order: DateOrder,
    /// How the QuickBooks Online company's region writes dates, which is how QuickBooks reads
    /// an imported journal's dates: `month_first` (mm/dd/yyyy, a US company, the default) or
    /// `day_first` (dd/mm/yyyy: the UK, Australia, most of the world). A wrong order books 5
    /// December on 12 May.
    pub qbo_date_order: DateOrder,
}

/// The order of day and month in a date a vendor's import reads.
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DateOrder {
    /// dd/mm/yyyy.
    #[default]
    DayFirst,
    /// mm/dd/yyyy.
    MonthFirst,
}

impl DateOrder {
    /// The `chrono` format of a date in this order.
    pub const fn format(self) -> &'static str {
        match self {
            DateOrder::DayFirst => "%d/%m/%Y",
            DateOrder::MonthFirst => "%m/%d/%Y",
        }
    }
}

/// One general-ledger account of the chart the exports map to.
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlAccount {
    /// The account number or code in the accounting system.
    pub code: String,
    /// Its name there (QuickBooks imports by name).
    pub name: String,
}

/// `[books.datev]`: what DATEV's EXTF header needs from the accountant.
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatevConfig {
    /// Beraternummer (1001 to 9999999).
    pub consultant_number: u32,
    /// Mandantennummer (1 to 99999).
    pub client_number: u32,
    /// Sachkontenlänge: digits of a general-ledger account (4 to 9).
    pub account_length: u8,
    /// The month the fiscal year starts in (1 to 12), for WJ-Beginn.
    pub fiscal_year_start_month: u8,
}

impl Default for DatevConfig {
    fn default() -> DatevConfig {
        DatevConfig {
            consultant_number: 1001,
            client_number: 1,
            account_length: 4,
            fiscal_year_start_month: 1,
        }
    }
}

impl Default for BooksConfig {
    fn default() -> BooksConfig {
        let gl = |code: &str, name: &str| GlAccount {
            code: code.into(),
            name: name.into(),
        };
        let mut accounts = BTreeMap::new();
        for (i, method) in Method::ALL.into_iter().enumerate() {
            accounts.insert(
                format!("custody:{}:{}", method.network(), method.asset()),
                gl(
                    &format!("{}", 1510 + i),
                    &format!("Crypto {} ({})", method.asset(), method.network()),
                ),
            );
        }
        accounts.insert(
            "customer:*".into(),
            gl("1710", "Customer prepayments (balances)"),
        );
        accounts.insert("revenue:rentals".into(), gl("8200", "GPU rental revenue"));
        accounts.insert("suspense:*".into(), gl("1590", "Crypto suspense"));
        accounts.insert(
            "suspense:reversed".into(),
            gl("1591", "Reversed credits to recover"),
        );
        accounts.insert("fx:gain_loss".into(), gl("2660", "FX gains and losses"));
        accounts.insert(
            "treasury:*".into(),
            gl("1520", "Crypto in treasury wallets"),
        );
        accounts.insert(
            "external:*".into(),
            gl("1595", "Crypto sent out, to classify"),
        );
        accounts.insert("expense:network_fees:*".into(), gl("4970", "Network fees"));
        BooksConfig {
            reporting_currency: None,
            timezone: "UTC".into(),
            accounts,
            datev: DatevConfig::default(),
            xero_tax_rate: "No VAT".into(),
            xero_date_order: DateOrder::DayFirst,
            qbo_date_order: DateOrder::MonthFirst,
        }
    }
}

/// `[payments]`.
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PaymentsConfig {
    /// Methods customers may pick; each also needs its network configured.
    #[cfg_attr(test, schemars(with = "Vec<String>"))]
    pub enabled_methods: Vec<Method>,
    /// Minutes from creation to deadline, unless a method overrides it.
    pub default_deadline_minutes: u32,
    /// Per-method deadline overrides, in minutes.
    #[cfg_attr(test, schemars(with = "BTreeMap<String, u32>"))]
    pub deadline_minutes: BTreeMap<Method, u32>,
    /// Hours an intent stays watched after its deadline, so late money is found.
    pub monitoring_window_hours: u32,
    /// Underpayment accepted as full payment, in basis points of the amount (50 = 0.5 %).
    pub underpayment_tolerance_bps: u32,
    /// Money beyond the amount asked: `hold` or `credit_balance`.
    pub overpayment_policy: CreditPolicy,
    /// Money first seen after the deadline: `hold` or `credit_balance`.
    pub late_payment_policy: CreditPolicy,
    /// Label wallets show in payment URIs.
    pub label: String,
    /// Per method, in the asset's units (`sol = "0.00001"`): a receipt below it is dust
    /// (address poisoning, spam). At an intent's address it never counts toward the intent and
    /// opens no exception, held in `suspense:dust`; to no payment instructions it is counted
    /// in one exception per network and day. Overrides the defaults method by method; `"0"`
    /// turns it off.
    #[cfg_attr(test, schemars(with = "BTreeMap<String, String>"))]
    pub dust: BTreeMap<Method, String>,
    /// Minutes between two holdings checks of `payrecon serve`: every address payrecon
    /// watches on Ethereum read on the chain at the watcher's cursor, and money there that no
    /// receipt explains booked and held in a `holdings_difference` exception. `0` turns it off.
    pub holdings_check_minutes: u32,
    /// Per network, a block explorer's page of a transaction, `{txid}` where its id goes
    /// (`litecoin = "https://litecoinspace.org/tx/{txid}"`): the checkout page links each
    /// payment that arrived there. Mainnets have one by default; `""` turns it off.
    #[cfg_attr(test, schemars(with = "BTreeMap<String, String>"))]
    pub explorer_urls: BTreeMap<Network, String>,
    /// Per method, who pays a refund's network fee: `shop` (the default: the customer gets
    /// the whole amount back) or `customer` (taken from the amount; native coins only).
    #[cfg_attr(test, schemars(with = "BTreeMap<String, String>"))]
    pub refund_fee_payer: BTreeMap<Method, crate::records::FeePayer>,
}

impl Default for PaymentsConfig {
    fn default() -> PaymentsConfig {
        PaymentsConfig {
            enabled_methods: Vec::new(),
            default_deadline_minutes: 60,
            deadline_minutes: BTreeMap::new(),
            monitoring_window_hours: 7 * 24,
            underpayment_tolerance_bps: 0,
            overpayment_policy: CreditPolicy::Hold,
            late_payment_policy: CreditPolicy::Hold,
            label: "payrecon".to_owned(),
            dust: BTreeMap::new(),
            holdings_check_minutes: 60,
            explorer_urls: BTreeMap::new(),
            refund_fee_payer: BTreeMap::new(),
        }
    }
}

/// `[rates]`.
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RatesConfig {
    /// Sources to ask: `coingecko`, `kraken`, `recorded` (the file below).
    pub sources: Vec<String>,
    /// A quote older than this is stale.
    pub max_age_seconds: u32,
    /// A stablecoin further than this from 1 USD is refused, in percent.
    #[cfg_attr(test, schemars(with = "String"))]
    pub peg_band_percent: Decimal,
    /// A source is asked again only after this long.
    pub cache_seconds: u32,
    /// The books value a moment older than `max_age_seconds` from each provider's history:
    /// a historic price further than this from the moment is not used.
    pub history_tolerance_seconds: u32,
    /// CoinGecko's API base URL.
    #[cfg_attr(test, schemars(with = "String"))]
    pub coingecko_url: SecretUrl,
    /// CoinGecko demo API key, if any.
    #[cfg_attr(test, schemars(with = "Option<String>"))]
    pub coingecko_api_key: Option<Secret>,
    /// Kraken's API base URL.
    #[cfg_attr(test, schemars(with = "String"))]
    pub kraken_url: SecretUrl,
    /// Recorded quotes for offline runs (source `recorded`); relative to the config file.
    pub recorded_quotes_file: Option<PathBuf>,
}

impl Default for RatesConfig {
    fn default() -> RatesConfig {
        RatesConfig {
            sources: vec!["coingecko".into(), "kraken".into()],
            max_age_seconds: 300,
            peg_band_percent: Decimal::TWO,
            cache_seconds: 30,
            history_tolerance_seconds: 3600,
            coingecko_url: COINGECKO_URL.into(),
            coingecko_api_key: None,
            kraken_url: KRAKEN_URL.into(),
            recorded_quotes_file: None,
        }
    }
}

/// `[networks.*]`.
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworksConfig {
    /// Bitcoin.
    pub bitcoin: Option<UtxoConfig>,
    /// Litecoin.
    pub litecoin: Option<UtxoConfig>,
    /// Ethereum.
    pub ethereum: Option<EthereumConfig>,
    /// Tron.
    pub tron: Option<TronConfig>,
    /// Solana.
    pub solana: Option<SolanaConfig>,
}

/// `[networks.bitcoin]`, `[networks.litecoin]`.
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UtxoConfig {
    /// Account xpub (xpub, zpub, Ltub, tpub, vpub…) of m/84'/coin'/0'.
    pub xpub: String,
    /// `mainnet`, `testnet` or `regtest`.
    #[serde(default = "mainnet")]
    pub network: String,
    /// Confirmations before a payment counts.
    pub confirmations: u32,
    /// More confirmations for larger payments.
    #[serde(default)]
    pub confirmation_tiers: Vec<ConfirmationTier>,
    /// The Electrum server `payrecon serve` watches this network through:
    /// `tcp://host:port` or `ssl://host:port`. Set this or `rpc_url`, not both.
    #[serde(default)]
    #[cfg_attr(test, schemars(with = "Option<String>"))]
    pub electrum_url: Option<SecretUrl>,
    /// More Electrum servers after `electrum_url`, in order: when the one serving fails, times
    /// out or lags `max_source_lag_blocks` behind another, the watcher goes on with the next,
    /// and back to the first once it is healthy.
    #[serde(default)]
    #[cfg_attr(test, schemars(with = "Vec<String>"))]
    pub electrum_urls: Vec<SecretUrl>,
    /// The full node's JSON-RPC, `http://host:port` (user and password may be in it). Set
    /// this or `electrum_url`, not both.
    #[serde(default)]
    #[cfg_attr(test, schemars(with = "Option<String>"))]
    pub rpc_url: Option<SecretUrl>,
    /// More full nodes after `rpc_url`, in order, each with its user and password in its URL
    /// (`rpc_user`, `rpc_password`, `rpc_cookie_file` and `push_peer` are the first's): when
    /// the one serving fails or lags, the watcher goes on with the next, polled.
    #[serde(default)]
    #[cfg_attr(test, schemars(with = "Vec<String>"))]
    pub rpc_urls: Vec<SecretUrl>,
    /// How many blocks a source may lag behind another before the watcher leaves it.
    #[serde(default = "utxo_source_lag")]
    pub max_source_lag_blocks: u64,
    /// Second sources asked about each receipt before it is credited, one request each: every
    /// witness must hold the same transaction, in the same block, paying the same address the
    /// same amount of the same asset, as deep as the network's confirmations.
    #[serde(default)]
    #[cfg_attr(test, schemars(with = "Vec<String>"))]
    pub witness_urls: Vec<SecretUrl>,
    /// What a witness that stays silent (unreachable, behind) past `witness_wait_seconds`
    /// means: `hold` the receipt as a `sources_disagree` exception, or `warn` and credit it.
    /// A witness that contradicts the source always holds it.
    #[serde(default)]
    pub witness_policy: WitnessPolicy,
    /// How long a receipt waits for its witnesses before the policy applies.
    #[serde(default = "witness_wait_seconds")]
    pub witness_wait_seconds: u32,
    /// The RPC user (`rpcuser` or an `rpcauth` line on the node), with `rpc_password`.
    #[serde(default)]
    pub rpc_user: Option<String>,
    /// The RPC password.
    #[serde(default)]
    #[cfg_attr(test, schemars(with = "Option<String>"))]
    pub rpc_password: Option<Secret>,
    /// The node's cookie file instead of a user and password (e.g.
    /// `~/.bitcoin/.cookie`, `~/.litecoin/regtest/.cookie`).
    #[serde(default)]
    pub rpc_cookie_file: Option<std::path::PathBuf>,
    /// The node's P2P `host:port`: payrecon listens there for block and transaction
    /// announcements and scans at once (push); polling stays the fallback.
    #[serde(default)]
    pub push_peer: Option<String>,
    /// With `rpc_url`: the block height the very first scan starts at. By default the block of
    /// the earliest open payment's address, or the node's tip when there is none.
    #[serde(default)]
    pub start_height: Option<u64>,
    /// `false`: this process does not watch the network even though its method is enabled
    /// (another process does). `payrecon serve` refuses an enabled network without a source
    /// otherwise.
    #[serde(default = "yes")]
    pub watch: bool,
    /// The server must serve this genesis block; defaults to the network's own.
    #[serde(default)]
    pub genesis_hash: Option<String>,
    /// Pause between scans, in milliseconds (new intents and tip notifications are picked up
    /// at the next scan).
    #[serde(default = "poll_interval_ms")]
    pub poll_interval_ms: u32,
    /// Connecting and each request to the node, in milliseconds.
    #[serde(default = "timeout_ms")]
    pub timeout_ms: u32,
    /// The largest answer (an Electrum line) read from the node; more is refused and retried.
    /// By default: 256 MiB from a full node, 64 MiB from Ethereum, 32 MiB from Electrum, Tron
    /// and Solana.
    #[serde(default)]
    pub max_answer_bytes: Option<usize>,
    /// Where the account key sits below the wallet's master key, `[d34db33f/84h/0h/0h]`:
    /// `payrecon wallet export` writes it into the descriptors, which hardware wallets and
    /// Sparrow need to sign for them.
    #[serde(default)]
    pub key_origin: Option<String>,
    /// The stuck view warns when a wallet restored from this key needs a larger gap limit
    /// than this to find every paid address (20 is Electrum's and Sparrow's default).
    #[serde(default = "gap_limit_warning")]
    pub gap_limit_warning: u32,
    /// Unissued addresses watched ahead of each key's last handed-out one (a gap limit): money
    /// paid to one, handed out by a database since restored from a backup, is found and the
    /// counter moves past it.
    #[serde(default = "lookahead")]
    pub lookahead: u32,
    /// The merchant's own addresses on this network (cold storage, an exchange deposit
    /// address it controls): money swept there is booked to `treasury:…`, anywhere else to
    /// `external:…`.
    #[serde(default)]
    pub treasury_addresses: Vec<String>,
}

impl UtxoConfig {
    /// A section for `xpub` on `network` with `confirmations`, no data source yet, and the
    /// defaults of everything else.
    pub fn new(
        xpub: impl Into<String>,
        network: impl Into<String>,
        confirmations: u32,
    ) -> UtxoConfig {
        UtxoConfig {
            xpub: xpub.into(),
            network: network.into(),
            confirmations,
            confirmation_tiers: Vec::new(),
            electrum_url: None,
            electrum_urls: Vec::new(),
            rpc_url: None,
            rpc_urls: Vec::new(),
            max_source_lag_blocks: utxo_source_lag(),
            witness_urls: Vec::new(),
            witness_policy: WitnessPolicy::default(),
            witness_wait_seconds: witness_wait_seconds(),
            rpc_user: None,
            rpc_password: None,
            rpc_cookie_file: None,
            push_peer: None,
            start_height: None,
            watch: true,
            genesis_hash: None,
            poll_interval_ms: poll_interval_ms(),
            timeout_ms: timeout_ms(),
            max_answer_bytes: None,
            key_origin: None,
            gap_limit_warning: gap_limit_warning(),
            lookahead: lookahead(),
            treasury_addresses: Vec::new(),
        }
    }
}

/// What a witness's silence means for a receipt it has not confirmed.
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WitnessPolicy {
    /// Nothing is credited: the receipt waits as a `sources_disagree` exception.
    #[default]
    Hold,
    /// The receipt is credited on the source's word, with a warning in the log.
    Warn,
}

/// `[networks.ethereum]`.
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EthereumConfig {
    /// Account xpub of m/44'/60'/0'.
    pub xpub: String,
    /// EIP-155 chain id (1 = mainnet).
    #[serde(default = "ethereum_mainnet")]
    pub chain_id: u64,
    /// Confirmations before a payment counts.
    pub confirmations: u32,
    /// More confirmations for larger payments.
    #[serde(default)]
    pub confirmation_tiers: Vec<ConfirmationTier>,
    /// USDT's contract.
    #[serde(default = "usdt_erc20")]
    pub usdt_contract: String,
    /// USDC's contract.
    #[serde(default = "usdc_erc20")]
    pub usdc_contract: String,
    /// The JSON-RPC node `payrecon serve` watches through; without it no watcher runs.
    /// `http(s)://` polls; `ws(s)://` also subscribes to new heads and scans as each arrives.
    #[serde(default)]
    #[cfg_attr(test, schemars(with = "Option<String>"))]
    pub rpc_url: Option<SecretUrl>,
    /// More JSON-RPC endpoints after `rpc_url`, in order (another provider, your own node):
    /// when the one serving fails, times out or lags `max_source_lag_blocks` behind another,
    /// the watcher goes on with the next, and back to the first once it is healthy.
    #[serde(default)]
    #[cfg_attr(test, schemars(with = "Vec<String>"))]
    pub rpc_urls: Vec<SecretUrl>,
    /// How many blocks a source may lag behind another before the watcher leaves it.
    #[serde(default = "ethereum_source_lag")]
    pub max_source_lag_blocks: u64,
    /// Second sources asked about each receipt before it is credited, one request each: every
    /// witness must hold the same transaction, in the same block, paying the same address the
    /// same amount of the same asset, as deep as the network's confirmations.
    #[serde(default)]
    #[cfg_attr(test, schemars(with = "Vec<String>"))]
    pub witness_urls: Vec<SecretUrl>,
    /// What a witness that stays silent (unreachable, behind) past `witness_wait_seconds`
    /// means: `hold` the receipt as a `sources_disagree` exception, or `warn` and credit it.
    /// A witness that contradicts the source always holds it.
    #[serde(default)]
    pub witness_policy: WitnessPolicy,
    /// How long a receipt waits for its witnesses before the policy applies.
    #[serde(default = "witness_wait_seconds")]
    pub witness_wait_seconds: u32,
    /// `depth` (count `confirmations` blocks) or `finalized` (wait for the node's finalized
    /// block).
    #[serde(default)]
    pub finality: EthereumFinality,
    /// First block to scan on the very first start. By default the block of the earliest open
    /// payment's address, or the head when there is none.
    #[serde(default)]
    pub start_block: Option<u64>,
    /// Pause between scans when caught up, in milliseconds.
    #[serde(default = "poll_interval_ms")]
    pub poll_interval_ms: u32,
    /// Connecting and each request to the node, in milliseconds.
    #[serde(default = "timeout_ms")]
    pub timeout_ms: u32,
    /// The largest answer (an Electrum line) read from the node; more is refused and retried.
    /// By default: 256 MiB from a full node, 64 MiB from Ethereum, 32 MiB from Electrum, Tron
    /// and Solana.
    #[serde(default)]
    pub max_answer_bytes: Option<usize>,
    /// Unissued addresses watched ahead of each key's last handed-out one (a gap limit): money
    /// paid to one, handed out by a database since restored from a backup, is found and the
    /// counter moves past it.
    #[serde(default = "lookahead")]
    pub lookahead: u32,
    /// The merchant's own addresses on Ethereum: ETH and tokens swept there are booked to
    /// `treasury:…`, anywhere else to `external:…`.
    #[serde(default)]
    pub treasury_addresses: Vec<String>,
}

/// When an Ethereum payment counts as final.
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EthereumFinality {
    /// After `confirmations` blocks.
    #[default]
    Depth,
    /// Once the node's `finalized` block includes it.
    Finalized,
}

/// `[networks.tron]`.
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TronConfig {
    /// Account xpub of m/44'/195'/0'.
    pub xpub: String,
    /// Confirmations before a payment counts (19 is Tron's solidification depth).
    pub confirmations: u32,
    /// More confirmations for larger payments.
    #[serde(default)]
    pub confirmation_tiers: Vec<ConfirmationTier>,
    /// USDT's contract.
    #[serde(default = "usdt_trc20")]
    pub usdt_contract: String,
    /// The full node's HTTP API (`https://api.trongrid.io` or your own java-tron) that
    /// `payrecon serve` watches through; without it no watcher runs.
    #[serde(default)]
    #[cfg_attr(test, schemars(with = "Option<String>"))]
    pub api_url: Option<SecretUrl>,
    /// More full-node HTTP APIs after `api_url`, in order (they share `api_key`): when the one
    /// serving fails, times out or lags `max_source_lag_blocks` behind another, the watcher
    /// goes on with the next, and back to the first once it is healthy.
    #[serde(default)]
    #[cfg_attr(test, schemars(with = "Vec<String>"))]
    pub api_urls: Vec<SecretUrl>,
    /// How many blocks a source may lag behind another before the watcher leaves it.
    #[serde(default = "tron_source_lag")]
    pub max_source_lag_blocks: u64,
    /// Second sources asked about each receipt before it is credited, one request each: every
    /// witness must hold the same transaction, in the same block, paying the same address the
    /// same amount of the same asset, as deep as the network's confirmations.
    #[serde(default)]
    #[cfg_attr(test, schemars(with = "Vec<String>"))]
    pub witness_urls: Vec<SecretUrl>,
    /// What a witness that stays silent (unreachable, behind) past `witness_wait_seconds`
    /// means: `hold` the receipt as a `sources_disagree` exception, or `warn` and credit it.
    /// A witness that contradicts the source always holds it.
    #[serde(default)]
    pub witness_policy: WitnessPolicy,
    /// How long a receipt waits for its witnesses before the policy applies.
    #[serde(default = "witness_wait_seconds")]
    pub witness_wait_seconds: u32,
    /// TronGrid's API key, sent as `TRON-PRO-API-KEY`.
    #[serde(default)]
    #[cfg_attr(test, schemars(with = "Option<String>"))]
    pub api_key: Option<Secret>,
    /// `depth` (count `confirmations` blocks) or `solidified` (wait for the solidity node's
    /// head).
    #[serde(default)]
    pub finality: TronFinality,
    /// First block to scan on the very first start. By default the block of the earliest open
    /// payment's address, or the head when there is none.
    #[serde(default)]
    pub start_block: Option<u64>,
    /// Pause between scans when caught up, in milliseconds.
    #[serde(default = "poll_interval_ms")]
    pub poll_interval_ms: u32,
    /// Connecting and each request to the node, in milliseconds.
    #[serde(default = "timeout_ms")]
    pub timeout_ms: u32,
    /// The largest answer (an Electrum line) read from the node; more is refused and retried.
    /// By default: 256 MiB from a full node, 64 MiB from Ethereum, 32 MiB from Electrum, Tron
    /// and Solana.
    #[serde(default)]
    pub max_answer_bytes: Option<usize>,
    /// Unissued addresses watched ahead of each key's last handed-out one (a gap limit): money
    /// paid to one, handed out by a database since restored from a backup, is found and the
    /// counter moves past it.
    #[serde(default = "lookahead")]
    pub lookahead: u32,
    /// The merchant's own Tron addresses (base58): TRX and USDT swept there are booked to
    /// `treasury:…`, anywhere else to `external:…`.
    #[serde(default)]
    pub treasury_addresses: Vec<String>,
}

/// When a Tron payment counts as final.
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TronFinality {
    /// After `confirmations` blocks.
    #[default]
    Depth,
    /// Once the solidified head (`/walletsolidity/getnowblock`) includes it.
    Solidified,
}

/// `[networks.solana]`.
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SolanaConfig {
    /// The merchant's recipient account (base58).
    pub recipient: String,
    /// Confirmations before a payment counts; the watcher reports `finalized` as 1.
    #[serde(default = "one")]
    pub confirmations: u32,
    /// More confirmations for larger payments.
    #[serde(default)]
    pub confirmation_tiers: Vec<ConfirmationTier>,
    /// The JSON-RPC endpoint `payrecon serve` watches through; without it no watcher runs.
    #[serde(default)]
    #[cfg_attr(test, schemars(with = "Option<String>"))]
    pub rpc_url: Option<SecretUrl>,
    /// More JSON-RPC endpoints after `rpc_url`, in order: when the one serving fails, times
    /// out or lags `max_source_lag_blocks` slots behind another, the watcher goes on with the
    /// next, and back to the first once it is healthy.
    #[serde(default)]
    #[cfg_attr(test, schemars(with = "Vec<String>"))]
    pub rpc_urls: Vec<SecretUrl>,
    /// How many slots a source may lag behind another before the watcher leaves it.
    #[serde(default = "solana_source_lag")]
    pub max_source_lag_blocks: u64,
    /// Second sources asked about each receipt before it is credited, one request each: every
    /// witness must hold the same transaction, in the same block, paying the same address the
    /// same amount of the same asset, as deep as the network's confirmations.
    #[serde(default)]
    #[cfg_attr(test, schemars(with = "Vec<String>"))]
    pub witness_urls: Vec<SecretUrl>,
    /// What a witness that stays silent (unreachable, behind) past `witness_wait_seconds`
    /// means: `hold` the receipt as a `sources_disagree` exception, or `warn` and credit it.
    /// A witness that contradicts the source always holds it.
    #[serde(default)]
    pub witness_policy: WitnessPolicy,
    /// How long a receipt waits for its witnesses before the policy applies.
    #[serde(default = "witness_wait_seconds")]
    pub witness_wait_seconds: u32,
    /// Open references swept per scan for payments that carry one but pay someone else.
    #[serde(default = "references_per_scan")]
    pub references_per_scan: usize,
    /// Pause between scans, in milliseconds.
    #[serde(default = "poll_interval_ms")]
    pub poll_interval_ms: u32,
    /// Connecting and each request to the node, in milliseconds.
    #[serde(default = "timeout_ms")]
    pub timeout_ms: u32,
    /// The largest answer (an Electrum line) read from the node; more is refused and retried.
    /// By default: 256 MiB from a full node, 64 MiB from Ethereum, 32 MiB from Electrum, Tron
    /// and Solana.
    #[serde(default)]
    pub max_answer_bytes: Option<usize>,
    /// The merchant's own Solana addresses: SOL swept from the recipient there is booked to
    /// `treasury:…`, anywhere else to `external:…`.
    #[serde(default)]
    pub treasury_addresses: Vec<String>,
}

fn references_per_scan() -> usize {
    100
}

fn mainnet() -> String {
    "mainnet".into()
}
fn ethereum_mainnet() -> u64 {
    1
}
fn yes() -> bool {
    true
}
fn gap_limit_warning() -> u32 {
    20
}

/// Blocks a source may lag: about half an hour of Bitcoin, a minute of Ethereum and Tron, a
/// minute of Solana's slots.
fn witness_wait_seconds() -> u32 {
    600
}

fn utxo_source_lag() -> u64 {
    3
}

fn ethereum_source_lag() -> u64 {
    5
}

fn tron_source_lag() -> u64 {
    20
}

fn solana_source_lag() -> u64 {
    150
}

fn lookahead() -> u32 {
    DEFAULT_LOOKAHEAD
}

fn poll_interval_ms() -> u32 {
    2000
}
fn timeout_ms() -> u32 {
    30_000
}
fn one() -> u32 {
    1
}
fn usdt_erc20() -> String {
    "0xdAC17F958D2ee523a2206206994597C13D831ec7".into()
}
fn usdc_erc20() -> String {
    "0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48".into()
}
fn usdt_trc20() -> String {
    "TR7NHqjeKQxGTCi8q8ZY4pL8otSzgjLj6t".into()
}

impl Config {
    /// Loads the configuration. An explicitly named file must exist; the default file may not.
    pub fn load(explicit_file: Option<&Path>) -> Result<Config, ConfigError> {
        let file: PathBuf = match explicit_file {
            Some(path) if !path.exists() => {
                return Err(ConfigError::MissingFile(path.to_path_buf()));
            }
            Some(path) => path.to_path_buf(),
            None => PathBuf::from(DEFAULT_CONFIG_FILE),
        };
        let defaults = Config::defaults();
        let environment = Config::environment(&defaults);
        let mut config = Config::extract(
            Figment::from(Serialized::defaults(defaults))
                .merge(Toml::file(&file))
                .merge(environment),
        )?;
        // A relative path in a file means relative to that file, wherever payrecon runs.
        if let (Some(quotes), Some(dir)) = (&config.rates.recorded_quotes_file, file.parent())
            && quotes.is_relative()
            && file.exists()
        {
            config.rates.recorded_quotes_file = Some(dir.join(quotes));
        }
        Ok(config)
    }

    /// Every `PAYRECON_<KEY>` variable whose key is a top-level configuration key, nested keys
    /// split at `__`; values read as TOML values are (`true`, `3`, `["btc", "ltc"]`, `"2024"`
    /// for digits meant as text). The top-level keys are those of `defaults`. Other
    /// `PAYRECON_*` variables (`PAYRECON_LOG`, `PAYRECON_CONFIG`) belong to the command line
    /// and are left alone.
    fn environment(defaults: &serde_json::Value) -> Env {
        let keys: Vec<String> = defaults
            .as_object()
            .expect("the configuration is a table")
            .keys()
            .cloned()
            .collect();
        Env::prefixed(ENV_PREFIX).split("__").filter(move |key| {
            let top = key.as_str().split('.').next().unwrap_or_default();
            keys.iter().any(|known| known.eq_ignore_ascii_case(top))
        })
    }

    /// The configuration a shop embedding payrecon keeps as text: the same keys as the file,
    /// the same defaults and checks, no file and no environment.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        Config::extract(
            Figment::from(Serialized::defaults(Config::defaults())).merge(Toml::string(text)),
        )
    }

    /// Every default, as the first layer under the file. Figment merges tables key by key, so
    /// the catalog's table of GPUs per lot is left out: a shop that lists its own replaces the
    /// default's (B200 = 2) instead of adding to it (serde fills it in when the file is silent).
    fn defaults() -> serde_json::Value {
        let mut defaults = serde_json::to_value(Config::default()).expect("the defaults serialize");
        if let Some(catalog) = defaults.get_mut("catalog").and_then(|c| c.as_object_mut()) {
            catalog.remove("gpus_per_lot");
        }
        defaults
    }

    /// The configuration `figment` holds, its catalog checked.
    fn extract(figment: Figment) -> Result<Config, ConfigError> {
        let mut config: Config = figment
            .extract()
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        config.catalog = config
            .catalog
            .validated()
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        Ok(config)
    }
}

/// Why the configuration could not be loaded or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `--config` named a file that does not exist.
    #[error("config file {0} does not exist")]
    MissingFile(PathBuf),
    /// A value has the wrong type or an unknown key was given.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Any key, nested ones included, is set by `PAYRECON_<KEY>` with `__` between its parts;
    /// the command line's own variables and strangers are not keys and change nothing.
    #[test]
    // `Jail::expect_with` takes a closure returning figment's own (large) error type.
    #[allow(clippy::result_large_err)]
    fn every_key_can_be_set_from_the_environment() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("PAYRECON_HTTP__LISTEN", "127.0.0.1:9999");
            jail.set_env("PAYRECON_PAYMENTS__DEFAULT_DEADLINE_MINUTES", "45");
            jail.set_env("PAYRECON_PAYMENTS__ENABLED_METHODS", r#"["ltc", "sol"]"#);
            jail.set_env("PAYRECON_DATABASE_DURABILITY", "relaxed");
            jail.set_env("PAYRECON_BOOKS__XERO_TAX_RATE", r#""2024""#);
            jail.set_env("PAYRECON_LOG", "debug");
            jail.set_env("PAYRECON_TEST_ELECTRUM", "tcp://127.0.0.1:1");
            let config = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(config.http.listen.as_deref(), Some("127.0.0.1:9999"));
            assert_eq!(config.payments.default_deadline_minutes, 45);
            assert_eq!(config.payments.enabled_methods, [Method::Ltc, Method::Sol]);
            assert_eq!(config.database_durability, Durability::Relaxed);
            assert_eq!(config.books.xero_tax_rate, "2024", "quoted digits are text");
            Ok(())
        });
    }

    /// Printing the configuration (a `{:?}` in a log line, a panic message) shows no
    /// credential: every one is a `Secret` or a `SecretUrl`.
    #[test]
    fn the_configuration_prints_without_its_credentials() {
        let planted = "PLANTED4711";
        let text = format!(
            r#"
            database_url = "postgres://payrecon:{planted}@db/payrecon"
            [rates]
            coingecko_api_key = "{planted}"
            coingecko_url = "https://api.coingecko.com/{planted}"
            [http]
            metrics_token = "{planted}"
            [networks.litecoin]
            xpub = "xpub"
            confirmations = 6
            rpc_url = "http://user:{planted}@node:9332"
            rpc_user = "user"
            rpc_password = "{planted}"
            [networks.tron]
            xpub = "xpub"
            confirmations = 19
            api_url = "https://api.trongrid.io/?key={planted}"
            api_key = "{planted}"
            [[webhooks]]
            name = "shop"
            url = "https://shop/hook?token={planted}"
            secret = "{planted}-long-enough"
            "#
        );
        let config: Config = Figment::from(Serialized::defaults(Config::default()))
            .merge(Toml::string(&text))
            .extract()
            .unwrap();
        assert_eq!(
            config.http.metrics_token.as_ref().map(Secret::expose),
            Some(planted)
        );
        let printed = format!("{config:?}");
        assert!(!printed.contains(planted), "{printed}");
    }
}

#[cfg(test)]
mod reference;
