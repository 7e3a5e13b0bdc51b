//! The checkout page in the customer's language, rendered on the server so that everything
//! essential (amount, address, QR code, deadline, status, "I have paid") works without
//! JavaScript; the script only adds copy buttons, the running countdown and the live status.
//!
//! Every string lives in `locales/<language>/checkout.ftl` (Fluent), compiled in; a language
//! is added by adding its file. The language comes from `?lang=`, then `Accept-Language`,
//! then English.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use fluent_templates::fluent_bundle::FluentValue;
use fluent_templates::{LanguageIdentifier, Loader};
use serde::Serialize;

use super::{Checkout, CheckoutStatus};
use crate::intent::{IntentStatus, qr_svg};

fluent_templates::static_loader! {
    static LOCALES = {
        locales: "./locales",
        fallback_language: "en",
        // Unicode isolation marks around each argument would end up inside copied addresses.
        customise: |bundle| bundle.set_use_isolating(false),
    };
}

/// The page's stylesheet and script, served from this origin so the policy below can forbid
/// everything inline and everything foreign.
pub(crate) const STYLESHEET: &str = include_str!("checkout.css");
/// See [`STYLESHEET`].
pub(crate) const SCRIPT: &str = include_str!("checkout.js");

/// The page may load its own stylesheet, script and live status and nothing else; it may not
/// be framed (no clickjacking of "I have paid"), and its form posts only to itself.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; \
     base-uri 'none'; frame-ancestors 'none'";

/// The languages there is a catalog for, sorted by tag.
static LANGUAGES: LazyLock<Vec<LanguageIdentifier>> = LazyLock::new(|| {
    let mut languages: Vec<LanguageIdentifier> = LOCALES.locales().cloned().collect();
    languages.sort_by_key(|language| language.to_string());
    languages
});

/// The language of a page: the one asked for by `?lang=` if there is a catalog for it, else
/// the best match of `Accept-Language`, else English.
pub(crate) fn choose_language(
    asked: Option<&str>,
    accept_language: Option<&str>,
) -> LanguageIdentifier {
    let mut requested: Vec<LanguageIdentifier> = Vec::new();
    if let Some(asked) = asked.and_then(|tag| tag.parse().ok()) {
        requested.push(asked);
    }
    if let Some(header) = accept_language {
        requested.extend(fluent_langneg::accepted_languages::parse(header));
    }
    let english: LanguageIdentifier = fluent_templates::langid!("en");
    fluent_langneg::negotiate_languages(
        &requested,
        &LANGUAGES,
        Some(&english),
        fluent_langneg::NegotiationStrategy::Lookup,
    )
    .first()
    .map_or(english.clone(), |language| (*language).clone())
}

/// The strings of one language.
struct Text<'a> {
    language: &'a LanguageIdentifier,
}

impl Text<'_> {
    /// A message without arguments, HTML-escaped.
    fn get(&self, id: &str) -> String {
        escape(&LOCALES.lookup(self.language, id)).into_owned()
    }

    /// A message with arguments, HTML-escaped (arguments included).
    fn with(&self, id: &str, args: &[(&'static str, String)]) -> String {
        escape(&self.plain(id, args)).into_owned()
    }

    /// A message with arguments, not escaped: for text set as text, never as HTML.
    fn plain(&self, id: &str, args: &[(&'static str, String)]) -> String {
        let args: HashMap<Cow<'static, str>, FluentValue<'_>> = args
            .iter()
            .map(|(name, value)| (Cow::Borrowed(*name), FluentValue::from(value.clone())))
            .collect();
        LOCALES.lookup_with_args(self.language, id, &args)
    }
}

/// The live status as the page's script receives it (server-sent events).
#[derive(Debug, Serialize)]
pub(crate) struct StatusUpdate {
    /// The intent's status as stored (`seen`, `settled`, …).
    pub status: &'static str,
    /// What to tell the customer, in their language.
    pub text: String,
    /// Whether the instructions may still be paid; when it changes the page reloads into
    /// its other layout.
    pub open: bool,
    /// Whether "I have paid" is still offered ([`CheckoutStatus::offers_paid_button`]).
    pub offers_paid_button: bool,
    /// Nothing will change any more ([`CheckoutStatus::is_final`]): the stream ends, and the
    /// page must not connect again.
    #[serde(rename = "final")]
    pub is_final: bool,
}

/// `status` said in `language`.
pub(crate) fn status_update(
    status: &CheckoutStatus,
    reference: &str,
    language: &LanguageIdentifier,
) -> StatusUpdate {
    let text = Text { language };
    StatusUpdate {
        status: status.code(),
        text: status_sentence(&text, status, reference),
        open: status.open,
        offers_paid_button: status.offers_paid_button(),
        is_final: status.is_final(),
    }
}

/// The status sentence, not escaped (it travels as JSON and is set as text).
fn status_sentence(text: &Text<'_>, status: &CheckoutStatus, reference: &str) -> String {
    let mut args = vec![("reference", reference.to_owned())];
    if let Some((have, required)) = status.confirmations {
        args.push(("confirmations", have.to_string()));
        args.push(("required", required.to_string()));
    }
    text.plain(&format!("status-{}", status.code()), &args)
}

/// The whole page for `checkout` at `now`, in `language`; `key` is the page's own key.
pub(crate) fn render(
    checkout: &Checkout,
    key: &str,
    language: &LanguageIdentifier,
    now: DateTime<Utc>,
    refund_refused: Option<&str>,
) -> String {
    let text = Text { language };
    let intent = &checkout.instructions.intent;
    let status = &checkout.status;
    let reference = intent.order_ref.as_str();
    let lang = language.to_string();
    let mut html = String::with_capacity(16 * 1024);
    let _ = write!(
        html,
        "<!doctype html>\n<html lang=\"{lang}\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta name=\"referrer\" content=\"no-referrer\">\n<title>{title}</title>\n\
         <link rel=\"stylesheet\" href=\"/assets/checkout.css\">\n\
         <script src=\"/assets/checkout.js\" defer></script>\n</head>\n<body>\n\
         <main id=\"checkout\" data-key=\"{key}\" data-lang=\"{lang}\" data-open=\"{open}\">\n",
        title = text.with("page-title", &[("reference", reference.to_owned())]),
        key = escape(key),
        open = status.open,
    );
    html.push_str("<nav class=\"languages\">");
    for other in LANGUAGES.iter() {
        let tag = other.to_string();
        let name = Text { language: other }.get("language-name");
        if other == language {
            let _ = write!(html, "<strong lang=\"{tag}\">{name}</strong>");
        } else {
            let _ = write!(
                html,
                "<a lang=\"{tag}\" hreflang=\"{tag}\" href=\"?lang={tag}\">{name}</a>"
            );
        }
    }
    let _ = write!(
        html,
        "</nav>\n<p class=\"reference\">{label}: <strong id=\"reference\">{reference}</strong></p>\n",
        label = text.get("reference-label"),
        reference = escape(reference),
    );

    if status.open {
        render_instructions(&mut html, &text, checkout, now);
    } else if status.status == IntentStatus::Expired {
        let _ = write!(
            html,
            "<h1 id=\"expired\">{heading}</h1>\n<p id=\"expired-body\" class=\"warning\">{body}</p>\n\
             <p>{paid}</p>\n",
            heading = text.get("expired-heading"),
            body = text.get("expired-body"),
            paid = text.with("expired-paid", &[("reference", reference.to_owned())]),
        );
    } else if status.checking_network {
        let _ = write!(
            html,
            "<h1 id=\"checking\">{heading}</h1>\n<p id=\"checking-body\" class=\"warning\">{body}</p>\n",
            heading = text.get("checking-heading"),
            body = text.get("checking-body"),
        );
    } else {
        let _ = writeln!(
            html,
            "<h1>{title}</h1>",
            title = text.with("page-title", &[("reference", reference.to_owned())])
        );
    }

    if !status.open && !checkout.arrived.is_empty() {
        render_record(&mut html, &text, checkout);
    }
    let _ = write!(
        html,
        "<section class=\"status\" aria-live=\"polite\">\n<h2>{label}</h2>\n\
         <p id=\"status\" data-status=\"{code}\">{sentence}</p>\n\
         <p id=\"live-paused\" class=\"hint\" hidden>{paused}</p>\n</section>\n",
        label = text.get("status-label"),
        paused = text.get("live-paused"),
        code = status.code(),
        sentence = escape(&status_sentence(&text, status, reference)),
    );
    render_refunds(&mut html, &text, checkout, key, refund_refused);
    if status.superseded && status.open {
        let _ = writeln!(
            html,
            "<p id=\"superseded\" class=\"warning\">{}</p>",
            text.get("superseded")
        );
    }
    if status.offers_paid_button() {
        let _ = write!(
            html,
            "<form id=\"paid-form\" method=\"post\" action=\"/pay/{key}/paid?lang={lang}\">\n\
             <button id=\"paid\" type=\"submit\">{button}</button>\n<p class=\"hint\">{hint}</p>\n</form>\n",
            key = escape(key),
            button = text.get("paid-button"),
            hint = text.get("paid-hint"),
        );
    } else if status.marked_paid && !matches!(status.status, IntentStatus::Settled) {
        let _ = writeln!(html, "<p id=\"paid-noted\">{}</p>", text.get("paid-noted"));
    }
    let _ = write!(
        html,
        "<noscript><p>{}</p></noscript>\n</main>\n</body>\n</html>\n",
        text.get("no-script")
    );
    html
}

/// What a closed page keeps: each payment that arrived (amount, asset and network, the
/// transaction with its explorer link, when it was received, how deep), when the intent was
/// credited, and the instructions it was paid on (the address shortened).
fn render_record(html: &mut String, text: &Text<'_>, checkout: &Checkout) {
    let utc = |at: &DateTime<Utc>| at.format("%Y-%m-%d %H:%M").to_string();
    let _ = write!(
        html,
        "<section id=\"arrived\" class=\"field\">\n<h2>{}</h2>\n<ul>\n",
        text.get("arrived-heading")
    );
    for arrived in &checkout.arrived {
        let txid = escape(&arrived.txid);
        let transaction = match &arrived.explorer_url {
            Some(url) => format!(
                "<a class=\"txid\" href=\"{}\" rel=\"noopener noreferrer\">{txid}</a>",
                escape(url)
            ),
            None => format!("<code class=\"txid\">{txid}</code>"),
        };
        let _ = write!(
            html,
            "<li class=\"receipt\"><p><strong>{amount}</strong>, {network}</p>\n\
             <p>{transaction_label}: {transaction}</p>\n<p>{received}; {confirmations}</p></li>\n",
            amount = escape(&arrived.amount),
            network = text.get(&format!("method-{}", arrived.method.id())),
            transaction_label = text.get("arrived-transaction"),
            received = text.with("arrived-received", &[("at", utc(&arrived.received_at))]),
            confirmations = text.with(
                "arrived-confirmations",
                &[("confirmations", arrived.confirmations.to_string())]
            ),
        );
    }
    html.push_str("</ul>\n");
    let intent = &checkout.instructions.intent;
    if let Some(settled_at) = intent
        .settled_at
        .filter(|_| checkout.status.status == IntentStatus::Settled)
    {
        let _ = writeln!(
            html,
            "<p id=\"settled-at\">{}</p>",
            text.with("arrived-settled", &[("at", utc(&settled_at))])
        );
    }
    let _ = write!(
        html,
        "</section>\n<section id=\"instructions-kept\" class=\"field\">\n<h2>{heading}</h2>\n<p>{body}</p>\n</section>\n",
        heading = text.get("kept-heading"),
        body = escape(&text.with(
            "kept-body",
            &[
                ("amount", checkout.instructions.amount_decimal.clone()),
                ("asset", checkout.instructions.asset.clone()),
                ("address", shortened(&intent.pay_to)),
                (
                    "network",
                    text.get(&format!("method-{}", intent.method.id()))
                ),
            ]
        )),
    );
}

/// The refunds of this payment's money, and the form asking for one while some waits: the
/// customer's address, checked as a payment address on the network the money arrived on.
fn render_refunds(
    html: &mut String,
    text: &Text<'_>,
    checkout: &Checkout,
    key: &str,
    refused: Option<&str>,
) {
    let reference = checkout.instructions.intent.order_ref.as_str();
    if !checkout.refunds.is_empty() {
        let _ = write!(
            html,
            "<section id=\"refunds\" class=\"field\">\n<h2>{}</h2>\n<ul>\n",
            text.get("refunds-heading")
        );
        for refund in &checkout.refunds {
            let _ = write!(
                html,
                "<li class=\"refund\" data-state=\"{state}\">{line}",
                state = refund.state.as_str(),
                line = escape(&text.with(
                    &format!("refund-{}", refund.state.as_str()),
                    &[
                        ("amount", refund.method.format_with_asset(refund.amount)),
                        ("address", refund.address.clone()),
                        ("reference", reference.to_owned()),
                    ]
                )),
            );
            if let Some(txid) = &refund.txid {
                let shown = escape(txid);
                let transaction = match &checkout.explorer {
                    Some(url) => format!(
                        "<a class=\"txid\" href=\"{}\" rel=\"noopener noreferrer\">{shown}</a>",
                        escape(&url.replace("{txid}", txid))
                    ),
                    None => format!("<code class=\"txid\">{shown}</code>"),
                };
                let _ = write!(html, " {}: {transaction}", text.get("arrived-transaction"));
            }
            html.push_str("</li>\n");
        }
        html.push_str("</ul>\n</section>\n");
    }
    if !checkout.refundable {
        return;
    }
    let lang = text.language.to_string();
    let _ = write!(
        html,
        "<form id=\"refund-form\" class=\"field\" method=\"post\" action=\"/pay/{key}/refund?lang={lang}\">\n\
         <h2>{heading}</h2>\n<p>{body}</p>\n",
        key = escape(key),
        heading = text.get("refund-heading"),
        body = text.get("refund-body"),
    );
    if let Some(why) = refused {
        let _ = writeln!(
            html,
            "<p id=\"refund-refused\" class=\"warning\" role=\"alert\">{sentence} <code>{why}</code></p>",
            sentence = text.get("refund-refused"),
            why = escape(why),
        );
    }
    let _ = write!(
        html,
        "<label for=\"refund-address\">{label}</label>\n\
         <input id=\"refund-address\" name=\"address\" required maxlength=\"128\" autocomplete=\"off\" spellcheck=\"false\">\n\
         <button id=\"refund\" type=\"submit\">{button}</button>\n</form>\n",
        label = text.get("refund-address-label"),
        button = text.get("refund-button"),
    );
}

/// An address as a closed page names it: enough to match it with the wallet's history, never
/// whole, so nobody copies it to pay again.
fn shortened(address: &str) -> String {
    let chars: Vec<char> = address.chars().collect();
    if chars.len() <= 12 {
        return address.to_owned();
    }
    let head: String = chars[..8].iter().collect();
    let tail: String = chars[chars.len() - 4..].iter().collect();
    format!("{head}…{tail}")
}

/// Amount, asset and network, address, QR code, wallet link and countdown.
fn render_instructions(
    html: &mut String,
    text: &Text<'_>,
    checkout: &Checkout,
    now: DateTime<Utc>,
) {
    let instructions = &checkout.instructions;
    let intent = &instructions.intent;
    let amount = escape(&instructions.amount_decimal);
    let asset = escape(&instructions.asset);
    let copy = text.get("copy");
    let copied = text.get("copied");
    let _ = write!(
        html,
        "<h1>{heading}</h1>\n\
         <section class=\"field\">\n<h2>{amount_label}</h2>\n<div class=\"value\"><code id=\"amount\">{amount}</code> \
         <span>{asset}</span> <button type=\"button\" class=\"copy\" data-copy=\"amount\" data-copied=\"{copied}\" hidden>{copy}</button></div>\n</section>\n\
         <section class=\"field\">\n<h2>{network_label}</h2>\n<p id=\"network\">{network}</p>\n\
         <p id=\"network-warning\" class=\"warning\" role=\"note\">{warning}</p>\n</section>\n\
         <section class=\"field\">\n<h2>{address_label}</h2>\n<div class=\"value\"><code id=\"address\">{address}</code> \
         <button type=\"button\" class=\"copy\" data-copy=\"address\" data-copied=\"{copied}\" hidden>{copy}</button></div>\n</section>\n",
        heading = text.with(
            "heading",
            &[
                ("amount", instructions.amount_decimal.clone()),
                ("asset", instructions.asset.clone())
            ]
        ),
        amount_label = text.get("amount-label"),
        network_label = text.get("network-label"),
        network = text.get(&format!("method-{}", intent.method.id())),
        warning = text.get("network-warning"),
        address_label = text.get("address-label"),
        address = escape(&intent.pay_to),
    );
    if let Ok(svg) = qr_svg(&instructions.payment_uri) {
        // The SVG comes from the QR encoder; only its XML declaration is cut for inlining.
        let svg = svg.find("<svg").map_or(svg.as_str(), |start| &svg[start..]);
        let _ = writeln!(
            html,
            "<figure id=\"qr\" class=\"qr\" role=\"img\" aria-label=\"{label}\">{svg}</figure>",
            label = text.get("qr-label"),
        );
    }
    let remaining = (intent.deadline - now).num_seconds().max(0);
    let _ = write!(
        html,
        "<p><a id=\"wallet-link\" class=\"wallet\" href=\"{uri}\">{wallet}</a></p>\n\
         <section class=\"deadline\">\n<h2>{label}</h2>\n\
         <p><time id=\"countdown\" datetime=\"{iso}\" data-deadline-ms=\"{deadline_ms}\">{left}</time></p>\n\
         <p>{at}</p>\n</section>\n",
        uri = escape(&instructions.payment_uri),
        wallet = text.get("wallet-link"),
        label = text.get("deadline-label"),
        iso = intent
            .deadline
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        deadline_ms = intent.deadline.timestamp_millis(),
        left = countdown(remaining),
        at = text.with(
            "deadline-at",
            &[(
                "deadline",
                intent.deadline.format("%Y-%m-%d %H:%M").to_string()
            )]
        ),
    );
}

/// `h:mm:ss`, or `m:ss` under an hour: the same in every language (the script counts the
/// same way).
pub(crate) fn countdown(seconds: i64) -> String {
    let (hours, minutes, seconds) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    if hours > 0 {
        format!("{hours}:{minutes:02}:{seconds:02}")
    } else {
        format!("{minutes}:{seconds:02}")
    }
}

/// The page for a link that names no payment, in `language`.
pub(crate) fn not_found(language: &LanguageIdentifier) -> String {
    let text = Text { language };
    format!(
        "<!doctype html>\n<html lang=\"{lang}\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{title}</title>\n<link rel=\"stylesheet\" href=\"/assets/checkout.css\">\n</head>\n\
         <body>\n<main id=\"checkout\">\n<h1 id=\"not-found\">{title}</h1>\n<p>{body}</p>\n</main>\n</body>\n</html>\n",
        lang = language,
        title = text.get("not-found-heading"),
        body = text.get("not-found-body"),
    )
}

/// `text` safe inside HTML text and double-quoted attributes.
fn escape(text: &str) -> Cow<'_, str> {
    if !text.contains(['<', '>', '&', '"', '\'']) {
        return Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '&' => escaped.push_str("&amp;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            c => escaped.push(c),
        }
    }
    Cow::Owned(escaped)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(language: &LanguageIdentifier) -> String {
        language.to_string()
    }

    #[test]
    fn the_language_comes_from_the_query_then_the_header_then_english() {
        assert_eq!(tag(&choose_language(Some("de"), Some("id"))), "de");
        assert_eq!(
            tag(&choose_language(None, Some("id-ID,id;q=0.9,en;q=0.8"))),
            "id"
        );
        assert_eq!(tag(&choose_language(None, Some("fr-CH, de;q=0.7"))), "de");
        assert_eq!(tag(&choose_language(Some("xx"), Some("fr"))), "en");
        assert_eq!(tag(&choose_language(Some("<script>"), None)), "en");
        assert_eq!(tag(&choose_language(None, None)), "en");
    }

    #[test]
    fn every_language_has_every_message_of_english() {
        let english = include_str!("../../locales/en/checkout.ftl");
        let ids: Vec<&str> = english
            .lines()
            .filter_map(|line| line.split_once(" = ").map(|(id, _)| id))
            .filter(|id| !id.starts_with('#') && !id.starts_with(' '))
            .collect();
        assert!(ids.len() > 30, "{ids:?}");
        let args: HashMap<&str, FluentValue<'_>> = [
            "reference",
            "amount",
            "asset",
            "confirmations",
            "required",
            "deadline",
            "at",
            "address",
            "network",
        ]
        .into_iter()
        .map(|name| (name, FluentValue::from("x")))
        .collect();
        for language in LANGUAGES.iter() {
            for id in &ids {
                assert!(
                    LOCALES
                        .lookup_no_default_fallback(language, id, Some(&args))
                        .is_some(),
                    "{language} lacks {id}"
                );
            }
        }
        assert_eq!(
            LANGUAGES.iter().map(tag).collect::<Vec<_>>(),
            ["de", "en", "id"]
        );
    }

    #[test]
    fn the_countdown_reads_the_same_everywhere() {
        assert_eq!(countdown(0), "0:00");
        assert_eq!(countdown(59), "0:59");
        assert_eq!(countdown(3599), "59:59");
        assert_eq!(countdown(3600), "1:00:00");
    }

    #[test]
    fn markup_in_text_is_escaped() {
        assert_eq!(escape("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&#39;");
        assert!(matches!(escape("plain"), Cow::Borrowed("plain")));
    }
}
