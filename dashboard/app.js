// FastInfer dashboard: plain JS, no build step. Talks to the service's own APIs.
"use strict";

const $ = (sel) => document.querySelector(sel);
const STAGES = ["read", "cache", "decode", "preprocess", "inference"];
let file = null;
let lastResults = null; // what Analyze sends: the results only, never the image
const KEY_STORE = "fastinfer-api-key"; // sessionStorage: the key lives as long as this tab, no longer
let keyWanted = null; // while the server asks for a key: the promise that the key form resolves

// The one way anything is put on the page: elements built here, every value from the server as text.
// No HTML is ever parsed from a string (no innerHTML), so a backend name or label that holds markup is
// shown as written, whatever the server lets through. Attribute names are always literals here, and no
// value from the server becomes a src, href or on* attribute.
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === false || value == null) continue;
    node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child == null || child === false) continue;
    node.append(child instanceof Node ? child : String(child)); // a string becomes a text node
  }
  return node;
}

// A bar filled to `fraction` of its width. Set through element.style, not a style attribute: the
// page's Content-Security-Policy allows no inline styles.
function bar(fraction) {
  const fill = el("span");
  fill.style.width = `${Math.min(100, Math.max(0, 100 * fraction || 0))}%`;
  return el("span", { class: "bar" }, fill);
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    return body.error ? `${body.error.message} (${body.error.code})` : `HTTP ${response.status}`;
  } catch {
    return `HTTP ${response.status}`;
  }
}

// fetch() for the service's APIs: sends this tab's API key, and on a 401 asks for one and retries.
async function api(path, init = {}) {
  for (;;) {
    const headers = new Headers(init.headers || {});
    const key = sessionStorage.getItem(KEY_STORE);
    if (key) headers.set("Authorization", `Bearer ${key}`);
    const response = await fetch(path, { ...init, headers });
    if (response.status !== 401) return response;
    // A key entered while this request was on its way is tried, not thrown away by this late 401.
    const entered = sessionStorage.getItem(KEY_STORE);
    if (entered && entered !== key) continue;
    sessionStorage.removeItem(KEY_STORE);
    showKeyState();
    await askForKey(key ? "That key was not accepted." : "This server needs an API key.");
  }
}

function askForKey(why) {
  $("#key-why").textContent = why;
  $("#key-form").hidden = false;
  $("#key-input").focus();
  keyWanted ||= new Promise((resolve) => {
    $("#key-form").onsubmit = (e) => {
      e.preventDefault();
      const key = $("#key-input").value.trim();
      if (!/^[A-Za-z0-9\-._~+/]+=*$/.test(key)) {
        $("#key-why").textContent = "An API key is letters, digits and -._~+/ (no spaces).";
        return;
      }
      sessionStorage.setItem(KEY_STORE, key);
      $("#key-input").value = "";
      $("#key-form").hidden = true;
      keyWanted = null;
      showKeyState();
      resolve();
    };
  });
  return keyWanted;
}

function showKeyState() {
  $("#key-state").hidden = !sessionStorage.getItem(KEY_STORE);
}

function forgetKey() {
  sessionStorage.removeItem(KEY_STORE);
  showKeyState();
}

async function loadBackends() {
  const response = await api("/backends");
  const info = await response.json();
  const hw = info.hardware;
  $("#machine").textContent =
    `${hw.cpu} · ${hw.cores} cores · ${hw.isa.join(", ") || "no SIMD extensions found"}` +
    `${hw.neural_engine ? " · Neural Engine" : ""}${hw.cuda ? " · CUDA" : ""}` +
    ` — recommended here: ${info.recommended.backend}` +
    ` · default: ${info.default} (${info.default_choice ? info.default_choice.source : "set"})`;
  showFamily(info.family);
  const list = $("#backends");
  list.replaceChildren(...info.backends.map((b) => el(
    "label",
    { class: b.available ? "option" : "option disabled", title: b.available ? b.description : b.reason },
    el("input", { type: "radio", name: "backend", id: `backend-${b.name}`, value: b.name, disabled: !b.available }),
    el("span", {},
      el("strong", {}, b.name), " ", el("span", { class: "muted" }, b.description),
      b.available ? null : el("span", { class: "reason" }, `unavailable: ${b.reason}`)),
  )));
  const preferred = document.getElementById(`backend-${info.default}`);
  const fallback = list.querySelector("input:not([disabled])");
  (preferred && !preferred.disabled ? preferred : fallback).checked = true;
  $("#weights-banner").hidden = !info.backends.some((b) => b.weights === "random-init");
}

// The model family this server serves: its name, classes, weights and the accuracy its build measured.
// top-k is capped at its class count (the server answers 400 beyond it).
function showFamily(family) {
  if (!family) return;
  $("#family-banner").hidden = family.stored;
  if (!family.stored) {
    $("#family").replaceChildren("model family ", el("strong", {}, family.name), " — not in the model store");
    $("#family-banner").textContent = family.missing;
    return;
  }
  const weights = family.weights_description ? `${family.weights} (${family.weights_description})` : family.weights;
  const measured = Object.entries(family.accuracy || {})
    .filter(([, a]) => typeof a.top1 === "number")
    .map(([backend, a]) => `${backend} ${(100 * a.top1).toFixed(1)}%`);
  $("#family").replaceChildren(
    "model family ", el("strong", { id: "family-name" }, family.name),
    ` · ${family.num_classes} classes · weights: ${weights}`,
    measured.length ? ` · top-1 measured when built: ${measured.join(", ")}` : " · accuracy not measured",
  );
  const topK = $("#top-k");
  topK.max = Math.min(Number(topK.max), family.num_classes);
  if (Number(topK.value) > Number(topK.max)) topK.value = topK.max;
}

function bars(items, max, cls, format) {
  return el("ul", { class: `bars ${cls}` }, items.map(([name, value]) =>
    el("li", {}, el("span", {}, name), bar(max ? value / max : 0), el("span", { class: "num" }, format(value)))));
}

function renderOne(r) {
  const top = r.top_k.map((p) => [p.label, p.score]);
  const stages = STAGES.map((s) => [s, r.timings_ms[s] || 0]);
  const slowest = Math.max(...stages.map(([, v]) => v));
  return [
    el("div", { class: "label" }, r["class"]),
    el("div", {},
      `${(100 * r.confidence).toFixed(1)}% on `, el("strong", {}, r.backend),
      r.cached ? el("span", { class: "badge cached", id: "cached-badge" }, "cached") : null,
      el("span", { class: r.weights === "random-init" ? "badge random" : "badge" }, `weights: ${r.weights}`)),
    el("div", { class: "muted small" }, `model ${r.model}`),
    el("h2", {}, `Top ${r.top_k.length}`),
    el("div", { id: "top5" }, bars(top, 1, "top", (v) => (100 * v).toFixed(1) + "%")),
    el("h2", {}, `Where the ${r.timings_ms.total.toFixed(1)} ms went`),
    el("div", { id: "timings" }, bars(stages, slowest, "timings", (v) => v.toFixed(1) + " ms")),
  ];
}

function renderCompare(c) {
  const slowest = Math.max(...c.results.map((r) => r.timings_ms.total));
  const s = c.summary;
  const head = ["backend", "top-1", "conf.", "inference ms", "total ms", ""].map((h) => el("th", {}, h));
  const rows = c.results.map((r) => el("tr", { "data-backend": r.backend },
    el("td", {}, el("strong", {}, r.backend)),
    el("td", {}, r["class"]),
    el("td", { class: "num" }, `${(100 * r.confidence).toFixed(1)}%`),
    el("td", { class: "num" }, r.timings_ms.inference.toFixed(1)),
    el("td", { class: "num" }, r.timings_ms.total.toFixed(1)),
    el("td", { class: "bar-cell" }, bar(r.timings_ms.total / slowest))));
  return [
    el("div", { id: "compare-summary" },
      el("strong", {}, s.fastest), " is fastest; ",
      s.all_agree_top1 ? "all backends agree on top-1" : el("span", { class: "error" }, "backends disagree on top-1"),
      ". ",
      s.unavailable.length ? el("span", { class: "muted" }, `Not on this machine: ${s.unavailable.join(", ")}.`) : null),
    el("table", { id: "compare-table" }, el("tr", {}, head), rows),
    el("p", { class: "muted small" },
      `Decoded once (${c.results[0].timings_ms.decode.toFixed(1)} ms), then each backend in turn, never from the cache.`),
  ];
}

async function classify() {
  if (!file) return;
  const backend = document.querySelector('input[name="backend"]:checked').value;
  const form = new FormData();
  form.append("image", file);
  form.append("top_k", $("#top-k").value);
  const compare = backend === "__compare__";
  if (!compare) form.append("backend", backend);
  $("#status").textContent = compare ? "running every backend…" : `classifying on ${backend}…`;
  $("#classify-btn").disabled = true;
  try {
    const response = await api(compare ? "/compare" : "/classify", { method: "POST", body: form });
    if (!response.ok) {
      $("#result").replaceChildren(el("span", { class: "error" }, await errorMessage(response)));
      lastResults = null;
    } else {
      const body = await response.json();
      $("#result").replaceChildren(...(compare ? renderCompare(body) : renderOne(body)));
      lastResults = compare ? body.results : [body];
    }
  } catch (err) {
    $("#result").replaceChildren(el("span", { class: "error" }, `request failed: ${err}`));
  } finally {
    $("#status").textContent = "";
    $("#classify-btn").disabled = false;
    $("#analyze-btn").disabled = !lastResults;
    $("#analysis").hidden = true;
  }
}

async function analyze() {
  if (!lastResults) return;
  const box = $("#analysis");
  box.hidden = false;
  box.className = "";
  box.textContent = "asking Groq…";
  const response = await api("/analyze", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ results: lastResults, question: "" }),
  });
  if (response.ok) {
    const body = await response.json();
    box.textContent = body.text;
  } else {
    box.className = "error";
    box.textContent = `Analysis unavailable: ${await errorMessage(response)}`;
  }
}

function choose(selected) {
  if (!selected) return;
  file = selected;
  const preview = $("#preview");
  preview.src = URL.createObjectURL(file);
  preview.hidden = false;
  $("#drop-hint").hidden = true;
  $("#classify-btn").disabled = false;
  classify();
}

async function refreshLive() {
  if (keyWanted) return; // the key form is up: one request waits for it, the timer need not pile more on
  try {
    const live = await (await api("/stats/live")).json();
    const p50 = Object.entries(live.p50_ms)
      .map(([b, v]) => el("tr", {}, el("td", {}, b), el("td", { class: "num" }, `${v.toFixed(1)} ms`)));
    $("#live").replaceChildren(
      el("div", {}, "requests served: ", el("strong", { id: "live-served" }, live.served)),
      el("div", {},
        `cache: ${live.cache.mode}, hit rate `, el("strong", {}, `${(100 * live.cache.hit_rate).toFixed(1)}%`),
        live.cache.healthy ? null : [" ", el("span", { class: "error" }, `degraded: ${live.cache.degraded}`)]),
      el("h2", {}, `p50 (last ${live.window})`),
      el("table", {}, p50.length ? p50 : el("tr", {}, el("td", { class: "muted" }, "no inference yet"))),
    );
  } catch {
    $("#live").textContent = "live stats unavailable";
  }
}

$("#file-input").addEventListener("change", (e) => choose(e.target.files[0]));
const zone = $("#drop-zone");
zone.addEventListener("dragover", (e) => { e.preventDefault(); zone.classList.add("over"); });
zone.addEventListener("dragleave", () => zone.classList.remove("over"));
zone.addEventListener("drop", (e) => { e.preventDefault(); zone.classList.remove("over"); choose(e.dataTransfer.files[0]); });
$("#classify-btn").addEventListener("click", classify);
$("#analyze-btn").addEventListener("click", analyze);
$("#forget-key").addEventListener("click", forgetKey);
document.addEventListener("change", (e) => { if (e.target.name === "backend" && file) classify(); });

showKeyState();
loadBackends();
refreshLive();
setInterval(refreshLive, 3000);
