//! Value leaving watched addresses: the inputs of a transaction that spend held outputs,
//! turned into outflows the same way for the full-node and the Electrum source.

use payrecon_chain_core::bitcoin::bech32::{Hrp, segwit};
use payrecon_chain_core::bitcoin::{Script, WitnessVersion};
use payrecon_chain_core::{
    Amount, HeldOutputs, Method, Network, Outflow, ReceivedAsset, ScanError, TransferId,
};

/// A transaction as both sources read it: its inputs' outpoints and its outputs.
pub(crate) struct Spending<'a> {
    /// Its id.
    pub(crate) txid: &'a str,
    /// Each input's previous outpoint, in input order (`None`: a coinbase input).
    pub(crate) inputs: Vec<Option<(String, u32)>>,
    /// Each output's script and value in base units.
    pub(crate) outputs: Vec<(&'a Script, u64)>,
}

/// Where outflows are looked up: the held outputs the engine gave, those received earlier in
/// the same scan (a payment and its sweep can sit in one range of blocks), and those the known
/// outflows spent (a reorg can move a spend to another block).
pub(crate) struct Lookup<'a> {
    pub(crate) held: &'a HeldOutputs,
    pub(crate) received: &'a HeldOutputs,
    pub(crate) spent: &'a HeldOutputs,
    pub(crate) network: Network,
    pub(crate) method: Method,
    pub(crate) hrp: &'a str,
}

impl Lookup<'_> {
    fn value(&self, txid: &str, vout: u32) -> Option<u64> {
        self.held
            .get(txid, vout)
            .or_else(|| self.received.get(txid, vout))
            .or_else(|| self.spent.get(txid, vout))
    }

    /// One outflow per input of `tx` that spends a held output. When every input is held the
    /// fee (inputs less outputs) is payrecon's to book and is taken from the first rows; when
    /// other coins were spent alongside, the fee cannot be split and each row sends its whole
    /// value. The destination is named when the transaction has a single output.
    pub(crate) fn outflows(&self, tx: &Spending<'_>) -> Vec<Outflow> {
        let spent: Vec<(u32, &str, u32, u64)> = tx
            .inputs
            .iter()
            .enumerate()
            .filter_map(|(index, input)| {
                let (txid, vout) = input.as_ref()?;
                let value = self.value(txid, *vout)?;
                Some((u32::try_from(index).ok()?, txid.as_str(), *vout, value))
            })
            .collect();
        if spent.is_empty() {
            return Vec::new();
        }
        let paid_out: u64 = tx.outputs.iter().map(|(_, value)| value).sum();
        let mut fee = if spent.len() == tx.inputs.len() {
            spent
                .iter()
                .map(|(_, _, _, value)| value)
                .sum::<u64>()
                .saturating_sub(paid_out)
        } else {
            0
        };
        let to_address = match tx.outputs.as_slice() {
            [(script, _)] => address_of(script, self.hrp),
            _ => None,
        };
        spent
            .into_iter()
            .map(|(index, txid, vout, value)| {
                let row_fee = fee.min(value);
                fee -= row_fee;
                Outflow {
                    id: TransferId {
                        network: self.network,
                        txid: tx.txid.to_owned(),
                        position: index,
                    },
                    spends: Some(TransferId {
                        network: self.network,
                        txid: txid.to_owned(),
                        position: vout,
                    }),
                    from_address: String::new(),
                    asset: ReceivedAsset::Method {
                        method: self.method,
                    },
                    amount: Amount::from(value - row_fee),
                    fee: Amount::from(row_fee),
                    to_address: to_address.clone(),
                }
            })
            .collect()
    }
}

/// The segwit address a script pays, on the chain of `hrp`; other scripts have none here.
pub(crate) fn address_of(script: &Script, hrp: &str) -> Option<String> {
    let version = script.witness_version()?;
    let program = script.as_bytes().get(2..)?;
    let hrp = Hrp::parse(hrp).ok()?;
    let version = match version {
        WitnessVersion::V0 => segwit::VERSION_0,
        WitnessVersion::V1 => segwit::VERSION_1,
        _ => return None,
    };
    segwit::encode(hrp, version, program).ok()
}

/// A coin amount as the 64-bit integer it always is on these chains (21 and 84 million coins
/// of 10^8 units each); anything larger is not a coin amount.
pub(crate) fn coin_units(amount: Amount) -> Result<u64, ScanError> {
    u64::try_from(amount.base_units())
        .map_err(|_| ScanError::Fatal(format!("{amount} base units is not a coin amount")))
}
