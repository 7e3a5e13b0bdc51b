//! BIP84 P2WPKH addresses from an account xpub, for Bitcoin and Litecoin.

use std::str::FromStr;

use payrecon_chain_core::bitcoin::bech32::{Hrp, segwit};
use payrecon_chain_core::bitcoin::{self, CompressedPublicKey};
use payrecon_chain_core::{AccountXpub, AddressDeriver, DeriveError, DerivedAddress, Network};

/// Which of the two UTXO chains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UtxoChain {
    /// Bitcoin (BIP84 coin type 0).
    Bitcoin,
    /// Litecoin (BIP84 coin type 2).
    Litecoin,
}

/// Mainnet, the public test network, or a local regtest chain: each has its own prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UtxoNetwork {
    /// Real money.
    Mainnet,
    /// The public test network.
    Testnet,
    /// A local regression-test chain.
    Regtest,
}

impl FromStr for UtxoNetwork {
    type Err = DeriveError;

    fn from_str(s: &str) -> Result<UtxoNetwork, DeriveError> {
        match s {
            "mainnet" => Ok(UtxoNetwork::Mainnet),
            "testnet" => Ok(UtxoNetwork::Testnet),
            "regtest" => Ok(UtxoNetwork::Regtest),
            other => Err(DeriveError::Config(format!(
                "unknown network {other:?}: expected mainnet, testnet or regtest"
            ))),
        }
    }
}

/// Derives `m/84'/coin'/0'/0/<index>` addresses below a configured account xpub.
#[derive(Clone, Debug)]
pub struct SegwitDeriver {
    account: AccountXpub,
    chain: UtxoChain,
    network: UtxoNetwork,
}

impl SegwitDeriver {
    /// A deriver for `chain` on `network` below `account`.
    pub fn new(account: AccountXpub, chain: UtxoChain, network: UtxoNetwork) -> SegwitDeriver {
        SegwitDeriver {
            account,
            chain,
            network,
        }
    }

    /// The bech32 human-readable part of this chain and network.
    fn hrp(&self) -> &'static str {
        hrp(self.chain, self.network)
    }
}

/// The bech32 human-readable part of `chain` on `network`.
/// The segwit address `script` pays on `chain`'s `network`; other scripts have none here.
pub fn segwit_address(
    script: &bitcoin::Script,
    chain: UtxoChain,
    network: UtxoNetwork,
) -> Option<String> {
    crate::spends::address_of(script, hrp(chain, network))
}

pub(crate) fn hrp(chain: UtxoChain, network: UtxoNetwork) -> &'static str {
    match (chain, network) {
        (UtxoChain::Bitcoin, UtxoNetwork::Mainnet) => "bc",
        (UtxoChain::Bitcoin, UtxoNetwork::Testnet) => "tb",
        (UtxoChain::Bitcoin, UtxoNetwork::Regtest) => "bcrt",
        (UtxoChain::Litecoin, UtxoNetwork::Mainnet) => "ltc",
        (UtxoChain::Litecoin, UtxoNetwork::Testnet) => "tltc",
        (UtxoChain::Litecoin, UtxoNetwork::Regtest) => "rltc",
    }
}

impl AddressDeriver for SegwitDeriver {
    fn network(&self) -> Network {
        match self.chain {
            UtxoChain::Bitcoin => Network::Bitcoin,
            UtxoChain::Litecoin => Network::Litecoin,
        }
    }

    fn key_id(&self) -> String {
        format!("{}:{}", self.hrp(), self.account.fingerprint())
    }

    /// `Address::p2wpkh` knows only Bitcoin's networks, so the witness program is encoded
    /// with bech32 directly; the program is the same HASH160 for both chains.
    fn derive(&self, index: u32) -> Result<DerivedAddress, DeriveError> {
        let key = CompressedPublicKey(self.account.receive_key(index)?);
        let program = key.wpubkey_hash();
        let hrp = Hrp::parse(self.hrp()).map_err(|e| DeriveError::Derivation(e.to_string()))?;
        let address = segwit::encode(hrp, segwit::VERSION_0, program.as_ref())
            .map_err(|e| DeriveError::Derivation(e.to_string()))?;
        Ok(DerivedAddress {
            watch_key: address.clone(),
            address,
        })
    }
}

/// What an output pays, as a transfer in `reported`'s place, for a witness's or the audit's
/// answer: the reported address where its script is that address's, else the script itself.
pub(crate) fn output_as_transfer(
    reported: &payrecon_chain_core::Transfer,
    method: payrecon_chain_core::Method,
    script: &bitcoin::ScriptBuf,
    amount: payrecon_chain_core::Amount,
) -> payrecon_chain_core::Transfer {
    let to_reported = script_pubkey(&reported.to_address).is_ok_and(|ours| ours == *script);
    payrecon_chain_core::Transfer {
        id: reported.id.clone(),
        to_address: if to_reported {
            reported.to_address.clone()
        } else {
            script.to_hex_string()
        },
        asset: payrecon_chain_core::ReceivedAsset::Method { method },
        amount,
        from_address: None,
    }
}

/// The scriptPubKey of an address a customer gives on `chain`'s `network`: segwit (the chain's
/// own bech32 prefix) or legacy base58 (P2PKH, P2SH, by the chain's version bytes). An
/// address of another chain or network is refused with the chain it belongs to where known.
pub fn customer_script(
    address: &str,
    chain: UtxoChain,
    network: UtxoNetwork,
) -> Result<bitcoin::ScriptBuf, DeriveError> {
    let refuse = |why: &str| {
        DeriveError::Config(format!(
            "{:?} is not a {} address: {why}",
            payrecon_chain_core::excerpt(address),
            describe(chain, network)
        ))
    };
    let text = address.trim();
    if let Ok((found, _, _)) = segwit::decode(text) {
        let wanted = hrp(chain, network);
        // Bech32 is written in small letters or in capitals, never mixed.
        let found = found.as_str().to_ascii_lowercase();
        if found != wanted {
            let other = [UtxoChain::Bitcoin, UtxoChain::Litecoin]
                .into_iter()
                .flat_map(|c| {
                    [
                        UtxoNetwork::Mainnet,
                        UtxoNetwork::Testnet,
                        UtxoNetwork::Regtest,
                    ]
                    .map(|n| (c, n))
                })
                .find(|(c, n)| hrp(*c, *n) == found);
            return Err(refuse(&match other {
                Some((c, n)) => format!("it is a {} address", describe(c, n)),
                None => format!("its prefix {found}1 is not {wanted}1"),
            }));
        }
        return script_pubkey(text).map_err(|e| refuse(&e.to_string()));
    }
    let bytes = bitcoin::base58::decode_check(text)
        .map_err(|_| refuse("neither bech32 nor base58 with a valid checksum"))?;
    let (version, hash) = match bytes.split_first() {
        Some((version, hash)) if hash.len() == 20 => (*version, hash),
        _ => return Err(refuse("a legacy address carries a 20-byte hash")),
    };
    let hash: [u8; 20] = hash.try_into().expect("20 bytes");
    let (p2pkh, p2sh): (&[u8], &[u8]) = match (chain, network) {
        (UtxoChain::Bitcoin, UtxoNetwork::Mainnet) => (&[0x00], &[0x05]),
        (UtxoChain::Bitcoin, _) => (&[0x6f], &[0xc4]),
        // Litecoin's M-addresses, and the 3-addresses it used before them.
        (UtxoChain::Litecoin, UtxoNetwork::Mainnet) => (&[0x30], &[0x32, 0x05]),
        (UtxoChain::Litecoin, _) => (&[0x6f], &[0x3a, 0xc4]),
    };
    if p2pkh.contains(&version) {
        Ok(bitcoin::ScriptBuf::new_p2pkh(
            &bitcoin::hashes::Hash::from_byte_array(hash),
        ))
    } else if p2sh.contains(&version) {
        Ok(bitcoin::ScriptBuf::new_p2sh(
            &bitcoin::hashes::Hash::from_byte_array(hash),
        ))
    } else {
        Err(refuse(&format!(
            "its version byte {version:#04x} is another chain's or network's"
        )))
    }
}

/// `Litecoin mainnet`, `Bitcoin regtest`: for people.
fn describe(chain: UtxoChain, network: UtxoNetwork) -> String {
    let network = match network {
        UtxoNetwork::Mainnet => "mainnet",
        UtxoNetwork::Testnet => "testnet",
        UtxoNetwork::Regtest => "regtest",
    };
    format!("{chain:?} {network}")
}

/// The scriptPubKey an address pays: what an Electrum server indexes by.
pub fn script_pubkey(address: &str) -> Result<bitcoin::ScriptBuf, DeriveError> {
    let (_, version, program) =
        segwit::decode(address).map_err(|e| DeriveError::Config(e.to_string()))?;
    let version = bitcoin::WitnessVersion::try_from(version)
        .map_err(|e| DeriveError::Config(e.to_string()))?;
    let program = bitcoin::WitnessProgram::new(version, &program)
        .map_err(|e| DeriveError::Config(e.to_string()))?;
    Ok(bitcoin::ScriptBuf::new_witness_program(&program))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_customer_address_is_of_its_chain_and_network() {
        // BIP173's and Litecoin's published examples.
        let ok = [
            (
                "bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kv8f3t4",
                UtxoChain::Bitcoin,
                UtxoNetwork::Mainnet,
            ),
            (
                "1BvBMSEYstWetqTFn5Au4m4GFg7xJaNVN2",
                UtxoChain::Bitcoin,
                UtxoNetwork::Mainnet,
            ),
            (
                "3J98t1WpEZ73CNmQviecrnyiWrnqRhWNLy",
                UtxoChain::Bitcoin,
                UtxoNetwork::Mainnet,
            ),
            (
                "LVg2kJoFNg45Nbpy53h7Fe1wKyeXVRhMH9",
                UtxoChain::Litecoin,
                UtxoNetwork::Mainnet,
            ),
        ];
        for (address, chain, network) in ok {
            customer_script(address, chain, network).unwrap();
        }
        let on_bitcoin = customer_script(
            "bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kv8f3t4",
            UtxoChain::Litecoin,
            UtxoNetwork::Mainnet,
        )
        .unwrap_err()
        .to_string();
        assert!(
            on_bitcoin.contains("it is a Bitcoin mainnet address"),
            "{on_bitcoin}"
        );
        let legacy_bitcoin = customer_script(
            "1BvBMSEYstWetqTFn5Au4m4GFg7xJaNVN2",
            UtxoChain::Litecoin,
            UtxoNetwork::Mainnet,
        )
        .unwrap_err()
        .to_string();
        assert!(
            legacy_bitcoin.contains("version byte 0x00"),
            "{legacy_bitcoin}"
        );
        let typo = customer_script(
            "LVg2kJoFNg45Nbpy53h7Fe1wKyeXVRhMH8",
            UtxoChain::Litecoin,
            UtxoNetwork::Mainnet,
        )
        .unwrap_err()
        .to_string();
        assert!(typo.contains("checksum"), "{typo}");
    }

    use payrecon_chain_core::test_vectors::BIP84_ZPUB;

    proptest::proptest! {
        #[test]
        fn any_text_is_an_address_or_refused(text in ".{0,90}|(bc1|ltc1|bcrt1|rltc1)[02-9ac-hj-np-z]{6,80}") {
            let _ = script_pubkey(&text);
        }

        /// Every address the deriver hands out is one the watcher can turn into its script.
        #[test]
        fn derived_addresses_have_their_script(index in 0..u32::MAX / 2) {
            let address = bitcoin_mainnet().derive(index).unwrap().address;
            let script = script_pubkey(&address).unwrap();
            proptest::prop_assert!(script.is_p2wpkh());
        }
    }

    fn bitcoin_mainnet() -> SegwitDeriver {
        SegwitDeriver::new(
            BIP84_ZPUB.parse().unwrap(),
            UtxoChain::Bitcoin,
            UtxoNetwork::Mainnet,
        )
    }

    #[test]
    fn bip84_vectors() {
        let deriver = bitcoin_mainnet();
        assert_eq!(
            deriver.derive(0).unwrap().address,
            "bc1qcr8te4kr609gcawutmrza0j4xv80jy8z306fyu"
        );
        assert_eq!(
            deriver.derive(1).unwrap().address,
            "bc1qnjg0jd8228aq7egyzacy8cys3knf9xvrerkf9g"
        );
    }

    #[test]
    fn the_same_xpub_as_xpub_prefix_derives_the_same_addresses() {
        let data = bitcoin::base58::decode_check(BIP84_ZPUB).unwrap();
        let mut xpub = data.clone();
        xpub[..4].copy_from_slice(&[0x04, 0x88, 0xB2, 0x1E]);
        let as_xpub = bitcoin::base58::encode_check(&xpub);
        let deriver = SegwitDeriver::new(
            as_xpub.parse().unwrap(),
            UtxoChain::Bitcoin,
            UtxoNetwork::Mainnet,
        );
        assert_eq!(
            deriver.derive(0).unwrap(),
            bitcoin_mainnet().derive(0).unwrap()
        );
    }

    #[test]
    fn litecoin_uses_its_own_prefixes_over_the_same_witness_program() {
        let account: AccountXpub = BIP84_ZPUB.parse().unwrap();
        for (network, hrp) in [
            (UtxoNetwork::Mainnet, "ltc1"),
            (UtxoNetwork::Testnet, "tltc1"),
            (UtxoNetwork::Regtest, "rltc1"),
        ] {
            let ltc = SegwitDeriver::new(account.clone(), UtxoChain::Litecoin, network)
                .derive(0)
                .unwrap()
                .address;
            assert!(ltc.starts_with(hrp), "{ltc}");
            let btc = bitcoin_mainnet().derive(0).unwrap().address;
            assert_eq!(
                script_pubkey(&ltc).unwrap(),
                script_pubkey(&btc).unwrap(),
                "one key, one script"
            );
        }
    }

    #[test]
    fn regtest_bitcoin_addresses_use_bcrt() {
        let deriver = SegwitDeriver::new(
            BIP84_ZPUB.parse().unwrap(),
            UtxoChain::Bitcoin,
            UtxoNetwork::Regtest,
        );
        assert!(deriver.derive(0).unwrap().address.starts_with("bcrt1q"));
    }
}
