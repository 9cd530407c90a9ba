// shoal live view: reads /api/timeline and /api/state, draws them. Plain JS, no build.
"use strict";

const token = new URLSearchParams(location.search).get("token");
const headers = token ? { Authorization: "Bearer " + token } : {};
let offsets = [];
let live = false;
let asked = 0;
let shown = null; // the offset on show (null: the latest)
const wouldRun = {}; // pod → the counterfactual's line, once asked

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

async function get(path) {
  const response = await fetch(path, { headers });
  if (!response.ok) throw new Error(path + ": " + response.status + " " + (await response.text()));
  return response.json();
}

function cores(milli) { return (milli / 1000).toLocaleString(undefined, { maximumFractionDigits: 1 }); }
function gib(bytes) { return (bytes / 2 ** 30).toLocaleString(undefined, { maximumFractionDigits: 1 }) + "Gi"; }

function drawNodes(nodes) {
  const box = document.getElementById("nodes");
  box.replaceChildren();
  if (!nodes.length) box.append(el("p", { class: "empty" }, "no nodes"));
  for (const n of nodes) {
    const cards = el("div", { class: "cards" });
    for (const c of n.cards) {
      const held = c.holders.map((h) => h.pod + (h.milli < 1000 ? " (" + h.milli + "m)" : "")).join(", ");
      const title = `card ${c.index}: ${c.status}, ${c.free_milli}m free` + (held ? `; held by ${held}` : "");
      const text = c.status === "idle" ? "idle" : c.status === "stranded" ? (held ? held + " · " : "") + "stranded" : held || c.status;
      cards.append(el("span", { class: "card " + c.status, title, "data-card": c.index }, `#${c.index} ${text}`));
    }
    box.append(el("div", { class: "node" + (n.unschedulable ? " cordoned" : ""), "data-node": n.name },
      el("span", { class: "name" }, n.name),
      el("span", { class: "meta" },
        `shard ${n.shard} · cpu ${cores(n.cpu.used)}/${cores(n.cpu.alloc)} · memory ${gib(n.memory.used)}/${gib(n.memory.alloc)}` +
        (n.unschedulable ? " · cordoned" : "")),
      n.cards.length ? cards : null,
      el("div", { class: "pods" }, n.pods.length ? "pods: " + n.pods.join(", ") : "no pods")));
  }
}

function fill(id, rows, empty) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren();
  if (!rows.length) {
    const cols = document.querySelectorAll(`#${id} th`).length;
    body.append(el("tr", {}, el("td", { class: "empty", colspan: cols }, empty)));
  }
  for (const row of rows) body.append(row);
}

function draw(state) {
  document.getElementById("source").textContent = state.source || "";
  document.getElementById("clock").textContent =
    `t=${state.time_seconds}s` + (state.offset === null || state.offset === undefined ? "" : ` · after offset ${state.offset}`);
  const s = state.summary;
  document.getElementById("summary").textContent =
    `${s.nodes} nodes · ${s.bound} bound · ${s.pending} pending · ${s.succeeded} succeeded · ${s.failed} failed`;
  drawNodes(state.nodes);
  fill("queue", state.queue.map((q) => el("tr", { "data-pod": q.pod },
    el("td", {}, q.pod), el("td", { class: "reason" }, q.reason,
      q.plugins && q.plugins.length ? el("div", { class: "pods" }, "plugins: " + q.plugins.join(", ")) : null,
      wouldRunCell(q.pod)),
    el("td", {}, q.attempts), el("td", {}, q.group || "-"), el("td", {}, q.shard ?? "-"))), "nothing pending");
  fill("groups", state.groups.map((g) => el("tr", {},
    el("td", {}, g.name), el("td", {}, g.phase), el("td", {}, g.scheduled), el("td", {}, g.min_member),
    el("td", {}, g.members), el("td", { class: "reason" }, g.reason || ""))), "no gangs");
  fill("quotas", state.quotas.flatMap((q) => q.resources.map((r) => el("tr", {},
    el("td", {}, q.namespace), el("td", {}, r.name), el("td", {}, r.used), el("td", {}, r.min),
    el("td", {}, r.max ?? "-"), el("td", {}, r.borrowed)))), "no quotas");
  const list = document.getElementById("decisions");
  list.replaceChildren(...state.decisions.map((d) => el("li", { value: d.offset }, `t=${d.time_seconds}s ${d.text}`)));
  if (!state.decisions.length) list.append(el("li", { class: "empty" }, "no decisions yet"));
  document.body.dataset.loaded = "true";
}

// "would run if?": asked on a click (the server copies the state and tries changes).
function wouldRunCell(pod) {
  const box = el("div", { class: "wouldrun", "data-would-run": pod });
  const key = pod + "@" + shown;
  if (key in wouldRun) { box.textContent = wouldRun[key]; return box; }
  const button = el("button", { type: "button" }, "would run if?");
  button.addEventListener("click", async () => {
    box.textContent = "trying changes…";
    try {
      const data = await get("/api/wouldrun?pod=" + encodeURIComponent(pod) + (shown === null ? "" : "&offset=" + shown));
      wouldRun[key] = data.counterfactual ? data.counterfactual.text : "no change tried lets it run";
    } catch (error) {
      wouldRun[key] = String(error.message || error);
    }
    box.textContent = wouldRun[key];
  });
  box.append(button);
  return box;
}

async function show(offset) {
  shown = offset;
  const mine = ++asked;
  try {
    const state = await get("/api/state" + (offset === null ? "" : "?offset=" + offset));
    if (mine !== asked) return; // a later request was made meanwhile
    document.getElementById("error").hidden = true;
    draw(state);
  } catch (error) {
    const box = document.getElementById("error");
    box.textContent = String(error.message || error);
    box.hidden = false;
  }
}

async function start() {
  let timeline = { offsets: [] };
  try { timeline = await get("/api/timeline"); } catch (error) { /* shown by show() */ }
  offsets = timeline.offsets || [];
  live = !timeline.log;
  const bar = document.getElementById("timeline");
  document.getElementById("note").textContent = timeline.note || "";
  if (offsets.length) {
    bar.hidden = false;
    const slider = document.getElementById("offset");
    slider.max = offsets.length - 1;
    slider.value = offsets.length - 1;
    const label = () => {
      const point = offsets[Number(slider.value)];
      document.getElementById("at").textContent = `offset ${point.offset} · t=${point.time_seconds}s · ${point.kind}`;
    };
    label();
    slider.addEventListener("input", label);
    slider.addEventListener("change", () => show(offsets[Number(slider.value)].offset));
    document.getElementById("end").addEventListener("click", () => {
      slider.value = offsets.length - 1; label(); show(null);
    });
  } else if (timeline.note) {
    bar.hidden = false;
    document.getElementById("offset").hidden = true;
    document.getElementById("end").hidden = true;
  }
  const start = new URLSearchParams(location.search).get("offset");
  if (start !== null && offsets.length) {
    const slider = document.getElementById("offset");
    const index = offsets.findIndex((p) => p.offset >= Number(start));
    slider.value = index < 0 ? offsets.length - 1 : index;
    slider.dispatchEvent(new Event("input"));
    await show(offsets[Number(slider.value)].offset);
  } else {
    await show(null);
  }
  if (live) setInterval(() => show(null), 2000);
}

start();
