//! Preparing what the merchant's wallet signs for an approved refund: a PSBT spending the
//! outputs that hold the money (Bitcoin, Litecoin), the unsigned transaction from the address
//! that holds it (Ethereum, Tron, Solana), and for every chain a payment request any wallet
//! pays it from. payrecon never signs; the chain then says when the refund happened
//! (`refund_chain`).

use payrecon_chain_bitcoin::{RefundInput, RefundOrder, RefundSource, refund_psbt};
use payrecon_chain_core::bitcoin::{OutPoint, Txid};
use payrecon_chain_core::{Amount, Method, Network, ScanError};
use payrecon_chain_ethereum::{Sending, UnsignedTransaction, unsigned_transfer};
use payrecon_chain_solana::UnsignedSolanaTransfer;
use payrecon_chain_tron::{TronAddress, TronSending, UnsignedTronTransaction};
use serde::Serialize;

use crate::audit::Rechecker;
use crate::engine::Engine;
use crate::engine::refund_chain::{approved_refund, held_outputs};
use crate::error::Error;
use crate::operator::{MAX_ACTOR_LEN, check_text};
use crate::records::{FeePayer, Refund, RefundState, StoredTransfer};
use crate::store::{StoreError, operations, outflows, payments, refunds};

/// What `payrecon refund prepare` gives the merchant for one approved refund.
#[derive(Clone, Debug, Serialize)]
pub struct PreparedRefund {
    /// The refund, now `prepared`.
    pub refund: Refund,
    /// A request any wallet pays the refund from (BIP 21, EIP-681, `tron:`, Solana Pay): for
    /// a merchant who refunds from a treasury wallet rather than from where the money sits.
    pub payment_request: String,
    /// That request as a QR code, SVG.
    pub payment_request_qr: String,
    /// Bitcoin and Litecoin: the PSBT spending the outputs that hold the money.
    pub psbt: Option<RefundPsbt>,
    /// Ethereum, Tron and Solana: the unsigned transaction from the address that holds the
    /// money.
    pub unsigned_transaction: Option<UnsignedRefund>,
}

/// An account chain's unsigned refund transaction, in the form its signers take; `chain`
/// names which.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "chain", rename_all = "lowercase")]
pub enum UnsignedRefund {
    /// An EIP-1559 transaction's fields and its signing payload.
    Ethereum(UnsignedTransaction),
    /// The node's `createtransaction` / `triggersmartcontract` transaction, checked.
    Tron(UnsignedTronTransaction),
    /// A legacy message with the System Program's transfer, base64.
    Solana(UnsignedSolanaTransfer),
}

/// A Bitcoin-family refund's PSBT and what it does.
#[derive(Clone, Debug, Serialize)]
pub struct RefundPsbt {
    /// The PSBT (BIP 174), base64: what Sparrow, Electrum and `walletprocesspsbt` import.
    pub psbt: String,
    /// What the customer's address receives, in the asset's units.
    pub pays: String,
    /// The network fee, in the asset's units.
    pub fee: String,
    /// The fee rate, in satoshi (litoshi) per virtual byte.
    pub fee_rate: u64,
    /// Whether the rate is the source's estimate; `false`: its relay floor, for want of one.
    pub fee_rate_estimated: bool,
    /// The outputs it spends (`txid:vout`).
    pub inputs: Vec<String>,
    /// Where the change goes, on the account's change branch, when there is change.
    pub change_address: Option<String>,
    /// That address's path below the account key (`1/<index>`).
    pub change_path: Option<String>,
}

impl Engine {
    /// Prepares an approved refund for the merchant's wallet. Bitcoin and Litecoin: a PSBT
    /// that spends the outputs the refund's exception holds, pays the customer and sends the
    /// change to the account's change branch at the source's fee rate (preparing again gives
    /// the same change address). Ethereum: the unsigned transaction from the address that
    /// holds the money, with the ETH to send it first for gas. Every chain: a payment request.
    /// The refund becomes `prepared`.
    pub async fn prepare_refund(&self, id: &str, actor: &str) -> Result<PreparedRefund, Error> {
        check_text("actor", actor, MAX_ACTOR_LEN)?;
        let mut conn = self.db().pool().acquire().await?;
        let refund = approved_refund(&mut conn, id, "prepared").await?;
        let exception = operations::get_exception(&mut conn, &refund.exception_id)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("refund {id}'s exception is gone")))?;
        let held = held_outputs(&mut conn, &exception).await?;
        drop(conn);
        let (psbt, unsigned_transaction) = match refund.method.network() {
            Network::Bitcoin | Network::Litecoin => {
                (Some(self.prepare_psbt(&refund, &held).await?), None)
            }
            Network::Ethereum => (
                None,
                Some(UnsignedRefund::Ethereum(
                    self.prepare_ethereum(&refund, &held).await?,
                )),
            ),
            Network::Tron => (
                None,
                Some(UnsignedRefund::Tron(
                    self.prepare_tron(&refund, &held).await?,
                )),
            ),
            Network::Solana => (
                None,
                Some(UnsignedRefund::Solana(
                    self.prepare_solana(&refund, &held).await?,
                )),
            ),
        };
        let mut tx = self.db().begin_write().await?;
        if refund.state == RefundState::Approved {
            let what = if psbt.is_some() {
                "PSBT prepared"
            } else {
                "prepared"
            };
            self.move_in(&mut tx, &refund, RefundState::Prepared, None, (actor, what))
                .await?;
        }
        let prepared = refunds::get(tx.conn(), id)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("refund {id} vanished")))?;
        tx.commit().await?;
        self.notify_events();
        let payment_request = crate::intent::wallet_uri(
            refund.method,
            &refund.address,
            refund.amount,
            (&format!("Refund {}", refund.id), None),
            &self.payment_settings().uri,
        );
        let payment_request_qr = crate::intent::qr_svg(&payment_request)
            .map_err(|e| Error::InvalidInput(format!("refund {id}'s request as a QR code: {e}")))?;
        Ok(PreparedRefund {
            refund: prepared,
            payment_request,
            payment_request_qr,
            psbt,
            unsigned_transaction,
        })
    }

    /// The PSBT of a Bitcoin-family refund: the held outputs with their keys' paths and the
    /// transactions they came in, the change index kept on the refund.
    async fn prepare_psbt(
        &self,
        refund: &Refund,
        held: &[StoredTransfer],
    ) -> Result<RefundPsbt, Error> {
        let network = refund.method.network();
        let settings = self.payment_settings();
        let keys = settings
            .keys
            .get(&network)
            .ok_or_else(|| Error::InvalidInput(format!("network {network} is not configured")))?;
        let mut conn = self.db().pool().acquire().await?;
        let mut inputs = Vec::with_capacity(held.len());
        let mut wallet: Option<crate::keys::UtxoWallet> = None;
        for transfer in held {
            if let Some(spent) = outflows::spenders(&mut conn, &transfer.id)
                .await?
                .into_iter()
                .find(|o| !o.removed)
            {
                return Err(Error::InvalidInput(format!(
                    "the output {} was already spent in {}: refund from the merchant's wallet, which payrecon sees on the chain",
                    transfer.id, spent.outflow.id.txid
                )));
            }
            let intent = handed_out(&mut conn, network, &transfer.to_address).await?;
            let key = keys
                .get(&intent.key_id)
                .and_then(|k| k.wallet.clone())
                .ok_or_else(|| {
                    Error::InvalidInput(format!(
                        "key {} of {} is no longer configured: add it back as a retired key",
                        intent.key_id, transfer.to_address
                    ))
                })?;
            if wallet
                .as_ref()
                .is_some_and(|w| w.account.fingerprint() != key.account.fingerprint())
            {
                return Err(Error::InvalidInput(
                    "the refund's outputs belong to two account keys: send it from the merchant's wallet".into(),
                ));
            }
            let txid: Txid = transfer.id.txid.parse().map_err(|_| {
                StoreError::Corrupt(format!("transfer {} has no Bitcoin txid", transfer.id))
            })?;
            let value = u64::try_from(transfer.amount.base_units())
                .map_err(|_| StoreError::Corrupt(format!("transfer {}: amount", transfer.id)))?;
            inputs.push((
                RefundInput {
                    outpoint: OutPoint {
                        txid,
                        vout: transfer.id.position,
                    },
                    value,
                    receive_index: intent.derivation_index,
                    previous: None,
                },
                transfer.block_height,
            ));
            wallet = Some(key);
        }
        drop(conn);
        let wallet = wallet.ok_or_else(|| {
            Error::InvalidInput(format!(
                "exception {} holds no output to spend",
                refund.exception_id
            ))
        })?;
        let (previous, rate) = source_facts(&settings.networks, network, &inputs).await?;
        let change_index = self.keep_change_index(&refund.id, network).await?;
        let chain = utxo_chain(network);
        let order = RefundOrder {
            inputs: inputs
                .into_iter()
                .zip(previous)
                .map(|((input, _), previous)| RefundInput {
                    previous: Some(previous),
                    ..input
                })
                .collect(),
            pay_to: payrecon_chain_bitcoin::customer_script(&refund.address, chain, wallet.network)
                .map_err(|e| Error::InvalidInput(e.to_string()))?,
            amount: u64::try_from(refund.amount.base_units())
                .map_err(|_| Error::InvalidInput("refund amount out of range".into()))?,
            fee_from_amount: refund.fee_payer == FeePayer::Customer,
            change_index,
            fee_rate: rate.sat_per_vbyte,
        };
        let built = refund_psbt(&wallet.account, wallet.origin.as_ref(), &order)
            .map_err(|e| Error::InvalidInput(format!("refund {}: {e}", refund.id)))?;
        let method = refund.method;
        Ok(RefundPsbt {
            psbt: built.psbt.to_string(),
            pays: method.format_amount(Amount::from(built.pays)),
            fee: method.format_amount(Amount::from(built.fee)),
            fee_rate: rate.sat_per_vbyte,
            fee_rate_estimated: rate.estimated,
            inputs: order
                .inputs
                .iter()
                .map(|i| i.outpoint.to_string())
                .collect(),
            change_address: built.change.as_ref().and_then(|(script, _)| {
                payrecon_chain_bitcoin::segwit_address(script, chain, wallet.network)
            }),
            change_path: built.change.as_ref().map(|_| format!("1/{change_index}")),
        })
    }

    /// The refund's change index, kept on it in a write transaction of its own (preparing
    /// again reuses it). Two refunds prepared at once on PostgreSQL may both read the same
    /// highest index: the unique index refuses the second, which takes the next.
    async fn keep_change_index(&self, id: &str, network: Network) -> Result<u32, Error> {
        const ATTEMPTS: usize = 3;
        let mut attempt = 1;
        loop {
            let mut tx = self.db().begin_write().await?;
            match refunds::change_index(tx.conn(), id, network.as_str()).await {
                Ok(index) => {
                    tx.commit().await?;
                    return Ok(index);
                }
                Err(StoreError::Database(sqlx::Error::Database(e)))
                    if e.is_unique_violation() && attempt < ATTEMPTS =>
                {
                    attempt += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The unsigned transaction sending an Ethereum refund from the one address that holds
    /// its money, at the node's nonce and fees.
    async fn prepare_ethereum(
        &self,
        refund: &Refund,
        held: &[StoredTransfer],
    ) -> Result<UnsignedTransaction, Error> {
        let refuse = |why: String| Error::InvalidInput(format!("refund {}: {why}", refund.id));
        let from = holding_address(refund, held)?;
        let settings = self.payment_settings();
        let address = |text: &str| {
            text.parse::<alloy_primitives::Address>()
                .map_err(|e| refuse(format!("{text:?} is not an Ethereum address: {e}")))
        };
        let (from, to) = (address(from)?, address(&refund.address)?);
        let units = refund.amount.base_units();
        let sending = match refund.method {
            Method::Eth => Sending::Eth { to, wei: units },
            Method::UsdtErc20 => Sending::Token {
                contract: address(&settings.uri.usdt_erc20_contract)?,
                to,
                units,
            },
            _ => Sending::Token {
                contract: address(&settings.uri.usdc_erc20_contract)?,
                to,
                units,
            },
        };
        let failed = |e: ScanError| Error::Chain(format!("ethereum: {e}"));
        let mut source = match first_source(self, Network::Ethereum)? {
            Rechecker::Ethereum(source) => source,
            _ => return Err(refuse("ethereum has no Ethereum source".into())),
        };
        let terms = source.account_terms(from).await.map_err(failed)?;
        Ok(unsigned_transfer(
            settings.uri.ethereum_chain_id,
            from,
            &terms,
            sending,
        ))
    }
}

impl Engine {
    /// The unsigned Tron transaction sending a refund from the one address that holds its
    /// money, as the node builds it and payrecon checks it.
    async fn prepare_tron(
        &self,
        refund: &Refund,
        held: &[StoredTransfer],
    ) -> Result<UnsignedTronTransaction, Error> {
        let refuse = |why: String| Error::InvalidInput(format!("refund {}: {why}", refund.id));
        let address = |text: &str| {
            text.parse::<TronAddress>()
                .map_err(|e| refuse(format!("{text:?} is not a Tron address: {e}")))
        };
        let from = address(holding_address(refund, held)?)?;
        let to = address(&refund.address)?;
        let sending = match refund.method {
            Method::Trx => TronSending::Trx {
                to,
                sun: u64::try_from(refund.amount.base_units())
                    .map_err(|_| refuse("its amount is out of range".into()))?,
            },
            _ => TronSending::Token {
                contract: address(&self.payment_settings().uri.usdt_trc20_contract)?,
                to,
                units: refund.amount.base_units(),
            },
        };
        let mut source = match first_source(self, Network::Tron)? {
            Rechecker::Tron(source) => source,
            _ => return Err(refuse("tron has no Tron source".into())),
        };
        source
            .unsigned_transfer(from, sending)
            .await
            .map_err(|e| Error::Chain(format!("tron: {e}")))
    }

    /// The unsigned SOL transfer sending a refund from the shop's recipient, where every
    /// Solana payment lands (a transfer's address is its reference, which holds nothing).
    async fn prepare_solana(
        &self,
        refund: &Refund,
        held: &[StoredTransfer],
    ) -> Result<UnsignedSolanaTransfer, Error> {
        let refuse = |why: &str| Error::InvalidInput(format!("refund {}: {why}", refund.id));
        if held.is_empty() {
            return Err(refuse("its exception holds no payment to send back"));
        }
        check_shop_pays_fee(refund)?;
        let from = self
            .solana_recipient()
            .ok_or_else(|| refuse("solana has no recipient configured"))?;
        let lamports = u64::try_from(refund.amount.base_units())
            .map_err(|_| refuse("its amount is out of range"))?;
        let mut source = match first_source(self, Network::Solana)? {
            Rechecker::Solana(source) => source,
            _ => return Err(refuse("solana has no Solana source")),
        };
        source
            .unsigned_transfer(&from, &refund.address, lamports)
            .await
            .map_err(|e| Error::Chain(format!("solana: {e}")))
    }

    /// The shop's one Solana recipient, which no watch key names.
    pub(crate) fn solana_recipient(&self) -> Option<String> {
        self.payment_settings()
            .derivers
            .get(&Network::Solana)
            .and_then(|deriver| deriver.derive(0).ok())
            .map(|derived| derived.address)
    }
}

/// The network's first configured source.
fn first_source(engine: &Engine, network: Network) -> Result<Rechecker, Error> {
    Rechecker::for_network(&engine.payment_settings().networks, network)
        .map_err(Error::InvalidInput)
}

/// The one address an account-chain refund is sent from: where its exception's one payment
/// sits (money spread over several addresses is sent from the merchant's wallet). The shop
/// pays the fee: only a PSBT fixes it, so only there can the customer's share be held to.
fn holding_address<'a>(refund: &Refund, held: &'a [StoredTransfer]) -> Result<&'a str, Error> {
    let refuse = |why: &str| Error::InvalidInput(format!("refund {}: {why}", refund.id));
    let from = match held {
        [one] => one.to_address.as_str(),
        [] => return Err(refuse("its exception holds no payment to send back")),
        _ => {
            return Err(refuse(
                "its money sits in several payments: send it from the merchant's wallet",
            ));
        }
    };
    check_shop_pays_fee(refund)?;
    Ok(from)
}

fn check_shop_pays_fee(refund: &Refund) -> Result<(), Error> {
    match refund.fee_payer {
        FeePayer::Customer => Err(Error::InvalidInput(format!(
            "refund {}: the customer pays the fee only of a Bitcoin-family refund",
            refund.id
        ))),
        FeePayer::Shop => Ok(()),
    }
}

/// The intent that handed `address` out: its key and index.
async fn handed_out(
    conn: &mut sqlx::AnyConnection,
    network: Network,
    address: &str,
) -> Result<crate::intent::PaymentIntent, Error> {
    payments::intents_by_watch_keys(conn, network, &[address])
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| Error::InvalidInput(format!("{address} is no address payrecon handed out")))
}

/// The transactions the refund spends (whole, for hardware wallets) and the fee rate, from
/// the network's first source.
async fn source_facts(
    networks: &crate::config::NetworksConfig,
    network: Network,
    inputs: &[(RefundInput, Option<u64>)],
) -> Result<
    (
        Vec<payrecon_chain_core::bitcoin::Transaction>,
        payrecon_chain_bitcoin::FeeRate,
    ),
    Error,
> {
    let wanted: Vec<(Txid, Option<u64>)> = inputs
        .iter()
        .map(|(input, seen_at)| (input.outpoint.txid, *seen_at))
        .collect();
    let failed = |e: payrecon_chain_core::ScanError| Error::Chain(format!("{network}: {e}"));
    let checker = Rechecker::for_network(networks, network).map_err(Error::InvalidInput)?;
    let (previous, rate) = match checker {
        Rechecker::Electrum(mut source) => (
            source.transactions(&wanted).await.map_err(failed)?,
            source.fee_rate().await.map_err(failed)?,
        ),
        Rechecker::Node(mut source) => (
            source.transactions(&wanted).await.map_err(failed)?,
            source.fee_rate().await.map_err(failed)?,
        ),
        _ => {
            return Err(Error::InvalidInput(format!(
                "network {network} has no Bitcoin-family source"
            )));
        }
    };
    Ok((previous, rate))
}

fn utxo_chain(network: Network) -> payrecon_chain_bitcoin::UtxoChain {
    match network {
        Network::Bitcoin => payrecon_chain_bitcoin::UtxoChain::Bitcoin,
        _ => payrecon_chain_bitcoin::UtxoChain::Litecoin,
    }
}
