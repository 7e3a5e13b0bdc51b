//! The hand-off to the merchant's wallet: what it imports to find every payment.

use payrecon_chain_core::Network;

use crate::engine::Engine;
use crate::error::Error;
use crate::records::FundedIndexes;
use crate::store;
use crate::wallet::{HoldingsSort, HoldingsView, MAX_HOLDINGS_PAGE, WalletExport, holdings_view};

impl Engine {
    /// The output descriptors of `network`'s account (Bitcoin or Litecoin) with the gap limit a
    /// wallet needs to find every address payrecon handed out and was paid on.
    pub async fn wallet_export(&self, network: Network) -> Result<WalletExport, Error> {
        let settings = self.payment_settings();
        let wallet = settings.wallets.get(&network).ok_or_else(|| {
            Error::InvalidInput(format!(
                "network {network}: no Bitcoin-family account is configured for it (wallet export covers bitcoin and litecoin)"
            ))
        })?;
        let descriptors = wallet
            .descriptors()
            .map_err(|e| Error::Config(format!("networks.{network}: {e}")))?;
        let funded = self.funded_indexes(network).await?;
        Ok(WalletExport::new(network, wallet, descriptors, &funded))
    }

    /// What each address holds, totals per asset and one page of the funded addresses
    /// (`network` alone, or every network): confirmed receipts less confirmed outflows.
    pub async fn holdings(
        &self,
        network: Option<Network>,
        sort: HoldingsSort,
        include_empty: bool,
        offset: u64,
        limit: usize,
    ) -> Result<HoldingsView, Error> {
        let limit = limit.clamp(1, MAX_HOLDINGS_PAGE);
        let mut conn = self.db().pool().acquire().await?;
        let rows = store::wallet::holdings(&mut conn, network.map(|n| n.as_str())).await?;
        drop(conn);
        holdings_view(
            rows,
            &self.payment_settings().wallets,
            sort,
            include_empty,
            offset,
            limit,
        )
    }

    /// How `network`'s current account key handed out receive indexes and which were paid.
    async fn funded_indexes(&self, network: Network) -> Result<FundedIndexes, Error> {
        let Some(deriver) = self.payment_settings().derivers.get(&network) else {
            return Ok(FundedIndexes::default());
        };
        let mut conn = self.db().pool().acquire().await?;
        Ok(store::wallet::funded_indexes(&mut conn, network.as_str(), &deriver.key_id()).await?)
    }
}
