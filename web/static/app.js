/* JODL web UI: live results of a batch and the operators' live status (Server-Sent Events).
   Text from the server is only ever put in the page with textContent: never as markup. */
"use strict";

function setText(row, name, value) {
  const cell = row.querySelector("." + name);
  if (cell) cell.textContent = value === null || value === undefined ? "" : String(value);
}

/* Times: <time datetime="...Z"> elements show the reader's local time and how long ago. */
const RELATIVE = typeof Intl !== "undefined" && Intl.RelativeTimeFormat
  ? new Intl.RelativeTimeFormat(undefined, { numeric: "auto", style: "short" }) : null;

function relative(date) {
  const seconds = (date.getTime() - Date.now()) / 1000;
  const abs = Math.abs(seconds);
  if (!RELATIVE) return "";
  if (abs < 45) return seconds < 0 ? RELATIVE.format(0, "second") : RELATIVE.format(Math.round(seconds), "second");
  if (abs < 45 * 60) return RELATIVE.format(Math.round(seconds / 60), "minute");
  if (abs < 22 * 3600) return RELATIVE.format(Math.round(seconds / 3600), "hour");
  return RELATIVE.format(Math.round(seconds / 86400), "day");
}

function localText(date) {
  const options = { day: "numeric", month: "short", hour: "2-digit", minute: "2-digit" };
  if (date.getFullYear() !== new Date().getFullYear()) options.year = "numeric";
  return date.toLocaleString(undefined, options);
}

function showTime(element) {
  const date = new Date(element.getAttribute("datetime"));
  if (Number.isNaN(date.getTime())) return;
  const ago = relative(date);
  element.textContent = localText(date) + (ago ? " (" + ago + ")" : "");
  element.title = date.toLocaleString(undefined, { dateStyle: "full", timeStyle: "long" });
}

function showTimes(root) {
  for (const element of root.querySelectorAll("time[datetime]")) showTime(element);
}

function timeElement(iso, empty) {
  if (!iso) return document.createTextNode(empty || "");
  const element = document.createElement("time");
  element.setAttribute("datetime", iso);
  element.textContent = iso;
  showTime(element);
  return element;
}

/* What a live view says about its connection: connected, reconnecting, or offline. */
const STALE_MS = 5000;
const OFFLINE_MS = 15000;

function connectionState(element) {
  let lastUpdate = 0;
  let lostSince = 0;
  const show = (state, text) => {
    element.classList.remove("live-ok", "live-reconnecting", "live-offline");
    element.classList.add("live-" + state);
    element.dataset.state = state;
    element.textContent = text;
  };
  const since = () => lastUpdate ? " Last update " + new Date(lastUpdate).toLocaleTimeString() + "." : "";
  return {
    updated(text) {
      lastUpdate = Date.now();
      lostSince = 0;
      show("ok", text);
    },
    lost(closed) {
      if (!lostSince) lostSince = Date.now();
      if (closed || Date.now() - lostSince > OFFLINE_MS) {
        show("offline", "Offline: no connection to the server; still trying." + since());
      } else {
        show("reconnecting", "Connection lost: reconnecting…" + since());
      }
    },
    /* Called every second: a connection that stays silent is as good as lost. */
    tick(source) {
      if (!lastUpdate) return;  // not connected yet: the error event speaks
      if (source.readyState !== EventSource.OPEN) this.lost(false);
      else if (lastUpdate && Date.now() - lastUpdate > STALE_MS) this.lost(false);
    },
  };
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
  const connection = document.getElementById("batch-connection");
  let answered = 0;
  let done = false;
  const source = new EventSource(state.dataset.events);
  const says = (text, lost) => {
    if (!connection) return;
    connection.textContent = text;
    connection.classList.toggle("live-reconnecting", lost);
  };
  source.addEventListener("open", () => says("", false));
  source.addEventListener("result", (msg) => {
    let event;
    try { event = JSON.parse(msg.data); } catch (e) { return; }
    if (showResult(event)) answered += 1;
    if (count) count.textContent = String(answered);
    says("", false);
  });
  source.addEventListener("complete", () => {
    done = true;
    source.close();
    says("", false);
    state.textContent = "Complete: all " + total + " URLs answered.";
    state.classList.add("complete");
  });
  source.addEventListener("error", () => {
    if (done) return;
    if (source.readyState === EventSource.CLOSED) {
      says("Connection closed; reload the page to resume.", true);
    } else {
      says("Connection lost: reconnecting…", true);
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
  const live = document.getElementById("live-state");
  const connection = live ? connectionState(live) : null;
  let source = null;
  const connect = () => {
    source = new EventSource(root.dataset.events);
    source.addEventListener("status", (msg) => {
      if (showStatus(root, msg) && connection) {
        connection.updated("Live: updated " + new Date().toLocaleTimeString() + ".");
      }
    });
    source.addEventListener("error", () => {
      if (!connection) return;
      const closed = source.readyState === EventSource.CLOSED;
      connection.lost(closed);
      // A closed stream (the server answered with an error) is not retried by the
      // browser: open a new one a little later.
      if (closed) setTimeout(connect, 5000);
    });
  };
  connect();
  if (connection) setInterval(() => connection.tick(source), 1000);
}

/* Puts one status event in the page; false when it cannot be read. */
function showStatus(root, msg) {
  const runUrl = root.dataset.runUrl;
  let data;
  try { data = JSON.parse(msg.data); } catch (e) { return false; }
  const runs = document.getElementById("runs");
  if (runs) {
    fillBody(runs, data.runs, (r) => {
      const tr = document.createElement("tr");
      const first = cell(tr, "");
      const link = document.createElement("a");
      link.href = runUrl.replace(/0$/, String(r.id));
      link.textContent = r.family + "#" + r.number;
      first.appendChild(link);
      const state = cell(tr, r.state);
      if (r.unserved && r.state === "running") {
        const why = document.createElement("span");
        why.className = "error";
        why.textContent = r.unserved;
        state.append(": ", why);
      }
      cell(tr, "").appendChild(timeElement(r.started_at));
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
          tr.cells[2].replaceChildren(timeElement(n.last_seen, "never"));
          tr.cells[3].textContent = String(n.slots);
          tr.cells[4].textContent = (n.speed || 1).toFixed(2);
          tr.cells[5].textContent = n.last_error || "";
          tr.cells[6].textContent = n.families.join(", ") + (n.reload_asked ? " (reload asked)" : "");
        }
      }
    }
  }
  return true;
}

document.addEventListener("DOMContentLoaded", () => {
  showTimes(document);
  setInterval(() => showTimes(document), 30000);
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
