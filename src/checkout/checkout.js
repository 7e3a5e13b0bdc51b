// The checkout page works without this script; it adds copy buttons, a running countdown and
// the live status (server-sent events from /pay/<key>/events).
"use strict";
(function () {
  var main = document.getElementById("checkout");
  if (!main || !main.dataset.key) { return; }

  document.querySelectorAll("button.copy").forEach(function (button) {
    var source = document.getElementById(button.dataset.copy);
    if (!source || !navigator.clipboard) { return; }
    button.hidden = false;
    var label = button.textContent;
    button.addEventListener("click", function () {
      navigator.clipboard.writeText(source.textContent).then(function () {
        button.textContent = button.dataset.copied;
        setTimeout(function () { button.textContent = label; }, 2000);
      });
    });
  });

  var countdown = document.getElementById("countdown");
  if (countdown) {
    var deadline = Number(countdown.dataset.deadlineMs);
    var tick = function () {
      var left = Math.max(0, Math.floor((deadline - Date.now()) / 1000));
      var hours = Math.floor(left / 3600), minutes = Math.floor(left / 60) % 60, seconds = left % 60;
      var pad = function (n) { return (n < 10 ? "0" : "") + n; };
      countdown.textContent = hours > 0
        ? hours + ":" + pad(minutes) + ":" + pad(seconds)
        : minutes + ":" + pad(seconds);
    };
    tick();
    setInterval(tick, 1000);
  }

  if (!window.EventSource) { return; }
  var status = document.getElementById("status");
  var open = main.dataset.open === "true";
  var events = new EventSource("/pay/" + main.dataset.key + "/events?lang=" + main.dataset.lang);
  var paused = document.getElementById("live-paused");
  events.addEventListener("error", function () {
    // Refused (the server is at its cap) or gone for good: the browser will not connect
    // again by itself, so the countdown stays and the page says to reload.
    if (events.readyState === EventSource.CLOSED && paused) { paused.hidden = false; }
  });
  events.addEventListener("status", function (message) {
    var update = JSON.parse(message.data);
    if (paused) { paused.hidden = true; }
    status.textContent = update.text;
    status.dataset.status = update.status;
    var paidForm = document.getElementById("paid-form");
    if (paidForm) { paidForm.hidden = !update.offers_paid_button; }
    if (update.open !== open) {
      // Paid, expired or late: the page has another layout; the server renders it.
      events.close();
      window.location.reload();
    } else if (update["final"]) {
      // Nothing changes any more: the server ends the stream, and the page stays as it is.
      events.close();
    }
  });
})();
