/* JODL web UI: live results of a batch and the operators' live status (Server-Sent Events).
   Text from the server is only ever put in the page with textContent: never as markup. */
"use strict";

function setText(row, name, value) {
  const cell = row.querySelector("." + name);
  if (cell) cell.textContent = value === null || value === undefined ? "" : String(value);
}

function showResult(event) {
  const row = document.getElementById("item-" + event.position);
  if (!row) return false;
  const fresh = row.classList.contains("waiting");
  row.classList.remove("waiting");
  row.classList.add(event.ok ? "ok" : "failed");
  if (event.cached) row.classList.add("cached");
  let status = event.status === null ? "—" : String(event.status);
  if (event.cached) status += " (cached)";
  setText(row, "status", status);
  setText(row, "title", event.title);
  setText(row, "size", event.size);
  setText(row, "fingerprint", event.fingerprint ? event.fingerprint.slice(0, 12) : "");
  setText(row, "changed", event.changed === null ? "" : (event.changed ? "yes" : "no"));
  setText(row, "excerpt", event.ok ? event.excerpt : event.error);
  if (event.final_url && event.final_url !== event.url) {
    setText(row, "url", event.url + " → " + event.final_url);
  }
  return fresh;
}

function followBatch(state) {
  const total = Number(state.dataset.total);
  const count = document.getElementById("batch-count");
  let answered = 0;
  const source = new EventSource(state.dataset.events);
  source.addEventListener("result", (msg) => {
    let event;
    try { event = JSON.parse(msg.data); } catch (e) { return; }
    if (showResult(event)) answered += 1;
    if (count) count.textContent = String(answered);
  });
  source.addEventListener("complete", () => {
    source.close();
    state.textContent = "Complete: all " + total + " URLs answered.";
    state.classList.add("complete");
  });
  source.addEventListener("error", () => {
    if (source.readyState === EventSource.CLOSED) {
      state.textContent = "Connection closed; reload the page to resume.";
    }
  });
}

function cell(row, value) {
  const td = document.createElement("td");
  td.textContent = value === null || value === undefined ? "" : String(value);
  row.appendChild(td);
  return td;
}

function fillBody(table, rows, build) {
  const body = table.querySelector("tbody");
  if (!body) return;
  const fresh = document.createElement("tbody");
  for (const item of rows) fresh.appendChild(build(item));
  body.replaceWith(fresh);
}

function followStatus(root) {
  const runUrl = root.dataset.runUrl;
  const live = document.getElementById("live-state");
  const source = new EventSource(root.dataset.events);
  source.addEventListener("status", (msg) => {
    let data;
    try { data = JSON.parse(msg.data); } catch (e) { return; }
    const runs = document.getElementById("runs");
    if (runs) {
      fillBody(runs, data.runs, (r) => {
        const tr = document.createElement("tr");
        const first = cell(tr, "");
        const link = document.createElement("a");
        link.href = runUrl.replace(/0$/, String(r.id));
        link.textContent = r.family + "#" + r.number;
        first.appendChild(link);
        cell(tr, r.state);
        cell(tr, r.started_at);
        const progress = cell(tr, "");
        const bar = document.createElement("progress");
        bar.max = r.jobs_total || 1;
        bar.value = r.jobs_done || 0;
        progress.appendChild(bar);
        progress.appendChild(document.createTextNode(" " + r.jobs_done + "/" + r.jobs_total));
        cell(tr, r.jobs_failed);
        cell(tr, r.jobs_dead);
        cell(tr, r.ratio ? r.ratio.toFixed(2) : "");
        return tr;
      });
    }
    const queue = document.getElementById("queue");
    if (queue) {
      fillBody(queue, Object.entries(data.queue), ([name, c]) => {
        const tr = document.createElement("tr");
        for (const v of [name, c.queued, c.overdue, c.running, c.done, c.dead]) cell(tr, v);
        return tr;
      });
    }
    const nodes = document.getElementById("nodes");
    if (nodes) {
      for (const n of data.nodes) {
        for (const tr of nodes.querySelectorAll("tbody tr")) {
          if (tr.cells[0] && tr.cells[0].textContent === n.address) {
            tr.cells[1].textContent = n.state;
            tr.cells[2].textContent = n.last_seen || "never";
            tr.cells[3].textContent = String(n.slots);
            tr.cells[4].textContent = (n.speed || 1).toFixed(2);
            tr.cells[5].textContent = n.last_error || "";
          }
        }
      }
    }
    if (live) live.textContent = "Live: updated " + new Date().toLocaleTimeString() + ".";
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const state = document.getElementById("batch-state");
  if (state && state.dataset.events) followBatch(state);
  const admin = document.getElementById("admin-live");
  if (admin && admin.dataset.events) followStatus(admin);
  for (const form of document.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", (e) => {
      if (!window.confirm(form.dataset.confirm)) e.preventDefault();
    });
  }
});
