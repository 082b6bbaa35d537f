// smithfs ui (docs/SPEC.md §14): the live parts of the pages, and confirm() before an action.
// No framework, no build step. Everything the server sends is already escaped HTML; log bytes
// fetched here are inserted as text nodes only, never as HTML.
"use strict";
(function () {
  var body = document.body;
  var POLL_MS = 500, REFRESH_MS = 5000;

  // Actions: ask first; a confirmed form says so, so the server does not ask again.
  document.addEventListener("submit", function (ev) {
    var f = ev.target;
    if (!f.matches || !f.matches("form.action")) return;
    if (!window.confirm(f.getAttribute("data-confirm") || "Are you sure?")) { ev.preventDefault(); return; }
    var c = f.querySelector("input[name=confirmed]");
    if (c) c.value = "1";
  });

  function banner(text) {
    var b = document.getElementById("banner");
    if (!b) return;
    b.textContent = text || "";
    b.classList.toggle("hidden", !text);
  }

  // Fragments (tree, a smith's status) refreshed on a new journal line, a mount change, or
  // every few seconds (times in state move on).
  function refreshLive() {
    var parts = document.querySelectorAll("[data-live]");
    return Promise.all(Array.prototype.map.call(parts, function (el) {
      return fetch(el.getAttribute("data-live"), { cache: "no-store", credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) { if (html !== null) el.innerHTML = html; });
    }));
  }

  // New rows of the event stream.
  function moreEvents() {
    var tb = document.getElementById("events");
    if (!tb || !tb.getAttribute("data-src")) return Promise.resolve();
    var from = tb.getAttribute("data-from");
    var url = tb.getAttribute("data-src");
    url += (url.indexOf("?") < 0 ? "?" : "&") + "from=" + encodeURIComponent(from);
    return fetch(url, { cache: "no-store", credentials: "same-origin" }).then(function (r) {
      if (!r.ok) return;
      var end = r.headers.get("X-Journal-End");
      return r.text().then(function (html) {
        if (end) tb.setAttribute("data-from", end);
        if (html) tb.insertAdjacentHTML("afterbegin", html);
      });
    });
  }

  var lastKey = null, lastRefresh = Date.now();
  function tick() {
    fetch("api/tick", { cache: "no-store", credentials: "same-origin" })
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
      .then(function (t) {
        var key = t.journal + ":" + t.mounted;
        var wasMounted = body.getAttribute("data-mounted") === "true";
        if (!t.mounted) {
          body.classList.add("readonly");
          banner(t.error ? "cannot read the tree: " + t.error
                         : "not mounted: read-only (read from the store; actions need a mount)");
        } else {
          body.classList.remove("readonly");
          banner("");
        }
        body.setAttribute("data-mounted", String(t.mounted));
        var due = Date.now() - lastRefresh > REFRESH_MS;
        if ((lastKey !== null && key !== lastKey) || due || wasMounted !== t.mounted) {
          lastRefresh = Date.now();
          lastKey = key;
          return Promise.all([refreshLive(), moreEvents()]);
        }
        lastKey = key;
      })
      .catch(function () { banner("the ui server does not answer (stopped?)"); })
      .then(function () { setTimeout(tick, POLL_MS); });
  }

  // A log: live output of a running run, and earlier parts on demand (Range requests).
  // As the server's html::log_text: control characters as symbols, bidirectional formatting
  // characters by their code (they would reorder what the operator reads: notes UI12).
  function safeText(s) {
    return s.replace(/[\x00-\x08\x0b-\x1f]/g, function (c) { return String.fromCharCode(0x2400 + c.charCodeAt(0)); })
            .replace(/\x7f/g, "\u2421").replace(/[\x80-\x9f]/g, "\ufffd")
            .replace(/[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g, function (c) {
              return "\u27e8U+" + c.charCodeAt(0).toString(16).toUpperCase().padStart(4, "0") + "\u27e9";
            });
  }
  function logSetup() {
    var pre = document.getElementById("log");
    if (!pre) return;
    var src = pre.getAttribute("data-src");
    var start = Number(pre.getAttribute("data-start"));
    var end = Number(pre.getAttribute("data-end"));
    var ended = pre.getAttribute("data-ended") === "1";
    var follow = pre.getAttribute("data-follow") === "1";
    var decoder = new TextDecoder("utf-8");
    var earlier = document.getElementById("log-earlier");
    if (earlier) {
      earlier.addEventListener("click", function (ev) {
        ev.preventDefault();
        if (start <= 0) return;
        var from = Math.max(0, start - 65536);
        fetch(src, { headers: { Range: "bytes=" + from + "-" + (start - 1) }, credentials: "same-origin" })
          .then(function (r) { return r.status === 206 ? r.arrayBuffer() : null; })
          .then(function (buf) {
            if (!buf) return;
            var text = new TextDecoder("utf-8").decode(buf);
            pre.insertBefore(document.createTextNode(safeText(text)), pre.firstChild);
            start = from;
            pre.setAttribute("data-start", String(start));
            if (start <= 0) earlier.parentNode.removeChild(earlier);
            else earlier.textContent = "earlier output (" + start + " bytes before)";
          });
      });
    }
    if (!follow || ended) return;
    function poll() {
      var atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      fetch(src, { headers: { Range: "bytes=" + end + "-" }, cache: "no-store", credentials: "same-origin" })
        .then(function (r) {
          var done = r.headers.get("X-Run-Ended") === "1";
          if (r.status !== 206) return { done: done, buf: null };
          return r.arrayBuffer().then(function (buf) { return { done: done, buf: buf }; });
        })
        .then(function (x) {
          if (x.buf && x.buf.byteLength > 0) {
            pre.appendChild(document.createTextNode(safeText(decoder.decode(x.buf, { stream: true }))));
            end += x.buf.byteLength;
            pre.setAttribute("data-end", String(end));
            if (atBottom) pre.scrollTop = pre.scrollHeight;
          }
          // Ended: one more read catches what was written just before the end.
          if (x.done && !(x.buf && x.buf.byteLength > 0)) { pre.setAttribute("data-ended", "1"); return; }
          setTimeout(poll, POLL_MS);
        })
        .catch(function () { setTimeout(poll, 2 * POLL_MS); });
    }
    pre.scrollTop = pre.scrollHeight;
    poll();
  }

  logSetup();
  setTimeout(tick, POLL_MS);
})();
