//! Configuration: built-in defaults, then a TOML file, then `PAYRECON_*` environment
//! variables, then command-line flags; each later source wins.

use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

/// The file read when no `--config` is given, if it exists.
pub const DEFAULT_CONFIG_FILE: &str = "payrecon.toml";

/// The database used when none is configured: a SQLite file beside the working directory.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://payrecon.db";

/// The configuration keys that `PAYRECON_<KEY>` environment variables may set. Other
/// `PAYRECON_*` variables (`PAYRECON_LOG`, `PAYRECON_CONFIG`) belong to the command line.
const ENV_KEYS: [&str; 1] = ["database_url"];

/// Everything payrecon reads at start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `sqlite://path` (embedded, the default) or `postgres://user@host/db` (production).
    pub database_url: String,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            database_url: DEFAULT_DATABASE_URL.to_owned(),
        }
    }
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
        Figment::from(Serialized::defaults(Config::default()))
            .merge(Toml::file(file))
            .merge(Env::prefixed("PAYRECON_").only(&ENV_KEYS))
            .extract()
            .map_err(|e| ConfigError::Invalid(e.to_string()))
    }
}

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `--config` named a file that does not exist.
    #[error("config file {0} does not exist")]
    MissingFile(PathBuf),
    /// A value has the wrong type or an unknown key was given.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}
