// FastInfer dashboard: plain JS, no build step. Talks to the service's own APIs.
"use strict";

const $ = (sel) => document.querySelector(sel);
const STAGES = ["read", "cache", "decode", "preprocess", "inference"];
let file = null;
let lastResults = null; // what Analyze sends: the results only, never the image
const KEY_STORE = "fastinfer-api-key"; // sessionStorage: the key lives as long as this tab, no longer
let keyWanted = null; // while the server asks for a key: the promise that the key form resolves

function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
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
    ` — recommended here: ${info.recommended.backend}`;
  const list = $("#backends");
  list.innerHTML = "";
  for (const b of info.backends) {
    const label = document.createElement("label");
    label.className = "option" + (b.available ? "" : " disabled");
    label.title = b.available ? b.description : b.reason;
    label.innerHTML =
      `<input type="radio" name="backend" id="backend-${b.name}" value="${b.name}" ${b.available ? "" : "disabled"}>` +
      `<span><strong>${b.name}</strong> <span class="muted">${escapeHtml(b.description)}</span>` +
      (b.available ? "" : `<span class="reason">unavailable: ${escapeHtml(b.reason)}</span>`) + `</span>`;
    list.appendChild(label);
  }
  const preferred = document.getElementById(`backend-${info.default}`);
  const fallback = list.querySelector("input:not([disabled])");
  (preferred && !preferred.disabled ? preferred : fallback).checked = true;
  $("#weights-banner").hidden = !info.backends.some((b) => b.weights === "random-init");
}

function bars(items, max, cls, format) {
  return `<ul class="bars ${cls}">` + items.map(([name, value]) =>
    `<li><span>${escapeHtml(name)}</span><span class="bar"><span style="width:${max ? (100 * value) / max : 0}%"></span></span>` +
    `<span class="num">${format(value)}</span></li>`).join("") + "</ul>";
}

function renderOne(r) {
  const badges =
    (r.cached ? '<span class="badge cached" id="cached-badge">cached</span>' : "") +
    `<span class="badge ${r.weights === "random-init" ? "random" : ""}">weights: ${escapeHtml(r.weights)}</span>`;
  const top = r.top_k.map((p) => [p.label, p.score]);
  const stages = STAGES.map((s) => [s, r.timings_ms[s] || 0]);
  const slowest = Math.max(...stages.map(([, v]) => v));
  return `<div class="label">${escapeHtml(r["class"])}</div>
    <div>${(100 * r.confidence).toFixed(1)}% on <strong>${escapeHtml(r.backend)}</strong>${badges}</div>
    <div class="muted small">model ${escapeHtml(r.model)}</div>
    <h2>Top ${r.top_k.length}</h2><div id="top5">${bars(top, 1, "top", (v) => (100 * v).toFixed(1) + "%")}</div>
    <h2>Where the ${r.timings_ms.total.toFixed(1)} ms went</h2>
    <div id="timings">${bars(stages, slowest, "timings", (v) => v.toFixed(1) + " ms")}</div>`;
}

function renderCompare(c) {
  const slowest = Math.max(...c.results.map((r) => r.timings_ms.total));
  const rows = c.results.map((r) => `<tr data-backend="${r.backend}"><td><strong>${r.backend}</strong></td>
      <td>${escapeHtml(r["class"])}</td><td class="num">${(100 * r.confidence).toFixed(1)}%</td>
      <td class="num">${r.timings_ms.inference.toFixed(1)}</td><td class="num">${r.timings_ms.total.toFixed(1)}</td>
      <td style="width:30%"><span class="bar"><span style="width:${(100 * r.timings_ms.total) / slowest}%"></span></span></td></tr>`);
  const s = c.summary;
  return `<div id="compare-summary"><strong>${s.fastest}</strong> is fastest;
      ${s.all_agree_top1 ? "all backends agree on top-1" : "<span class='error'>backends disagree on top-1</span>"}.
      ${s.unavailable.length ? `<span class="muted">Not on this machine: ${s.unavailable.join(", ")}.</span>` : ""}</div>
    <table id="compare-table"><tr><th>backend</th><th>top-1</th><th>conf.</th><th>inference ms</th><th>total ms</th><th></th></tr>
    ${rows.join("")}</table>
    <p class="muted small">Decoded once (${c.results[0].timings_ms.decode.toFixed(1)} ms), then each backend in turn, never from the cache.</p>`;
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
      $("#result").innerHTML = `<span class="error">${escapeHtml(await errorMessage(response))}</span>`;
      lastResults = null;
    } else {
      const body = await response.json();
      $("#result").innerHTML = compare ? renderCompare(body) : renderOne(body);
      lastResults = compare ? body.results : [body];
    }
  } catch (err) {
    $("#result").innerHTML = `<span class="error">request failed: ${escapeHtml(err)}</span>`;
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
      .map(([b, v]) => `<tr><td>${b}</td><td class="num">${v.toFixed(1)} ms</td></tr>`).join("");
    $("#live").innerHTML = `<div>requests served: <strong id="live-served">${live.served}</strong></div>
      <div>cache: ${escapeHtml(live.cache.mode)}, hit rate <strong>${(100 * live.cache.hit_rate).toFixed(1)}%</strong>
      ${live.cache.healthy ? "" : `<span class="error">degraded: ${escapeHtml(live.cache.degraded)}</span>`}</div>
      <h2>p50 (last ${live.window})</h2><table>${p50 || '<tr><td class="muted">no inference yet</td></tr>'}</table>`;
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
