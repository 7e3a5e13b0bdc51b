//! Every integration test in one crate (one link instead of one per topic), a module per topic:
//! `cargo test --test it litecoin_regtest::` runs one topic, `cargo test --test it <name>` one test.

#[macro_use]
mod common;

mod alerts;
mod api;
mod bad_input;
mod books;
mod books_devnet;
mod books_properties;
mod browser;
mod cli;
mod crash_points;
mod deadlines;
mod docs;
mod doctor;
mod durability;
mod edge;
mod ethereum_anvil;
mod ethereum_internal;
mod ethereum_sweep;
mod first_deployment;
mod group_commit;
mod handout;
mod leases;
mod ledger_properties;
mod litecoin_faults;
mod litecoin_mweb;
mod litecoin_node;
mod litecoin_regtest;
mod matcher_paths;
mod matching;
mod matching_properties;
mod multiprocess;
mod network_faults;
mod operations;
mod outflows;
mod outflows_properties;
mod rates;
mod refunds;
mod refunds_ethereum;
mod refunds_litecoin;
mod refunds_replay;
mod restores;
mod solana_replay;
mod solana_sweep;
mod sources;
mod store;
mod tours;
mod tron_replay;
mod tron_sweep;
mod upgrades;
mod wallet;
mod wallet_devnet;
mod witnesses;
