// The savepoints page. Plain JavaScript on the page's own JSON API (airflow_plugin/ui/app.py); every URL
// is relative to the page, so it works wherever Airflow mounts it. Data only ever reaches the DOM as text.
"use strict";

const PAGE_HEADER = "X-Savepoints-Page"; // state changes carry it: a cross-site form cannot (security.py)
const LIMIT = 50;
const POLL_BUSY_MS = 2000; // while a run, a snapshot or a deployment (IN_BETWEEN) is in flight
const POLL_IDLE_MS = 10000;
const SAVEPOINT_DAG = "savepoints_savepoint";
const UPGRADE_DAG = "savepoints_upgrade";
const DEPLOY_DAG = "savepoints_deploy";
const IN_BETWEEN = ["STARTING", "STOPPING"]; // a deployment on its way: the page looks again within seconds

const params = new URLSearchParams(window.location.search);
const state = {
  me: null,
  jobs: [],
  jobsFile: "",
  view: "", // "fleet": every job at a glance; "job": one job
  fleet: [], // the last overview rows (api/fleet)
  fleetSummary: null, // {text, unhealthy, running, ...}: the fleet in a line (views.fleet_summary)
  fleetSort: { key: "health", descending: false }, // unhealthy first, then by name
  job: params.get("job") || "",
  focus: params.get("snapshot") || "", // asked for once, on the first load of the job
  highlight: params.get("snapshot") || "", // stays highlighted afterwards
  offset: 0,
  kind: "",
  status: "",
  busy: false,
  savepoint: null, // {possible, deployment, reason}: can a savepoint be taken now (with the deployments)
  deploy: null, // {possible, reason}: can the job be deployed now (with the deployments)
  triggering: false,
  open: new Set(), // snapshot ids whose commands are shown
  timer: null,
  errors: new Map(), // what failed, by source: shown in the banner until it works again
  info: "", // what just happened, when nothing failed
  followed: null, // {dag, run_id, dag_paused}: the run this page triggered, followed in the banner until it ends
};

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "class") node.className = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const svg = (tag, attrs = {}, ...children) => {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, String(value));
  }
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
};

// --- talking to the API -------------------------------------------------------------------------------

class ApiFailure extends Error {
  constructor(status, message, kind) {
    super(message);
    this.status = status;
    this.kind = kind || "";
  }
}

async function api(path, { method = "GET", body } = {}) {
  const headers = { Accept: "application/json" };
  if (method !== "GET") {
    headers[PAGE_HEADER] = "1";
    headers["Content-Type"] = "application/json";
  }
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (err) {
    throw new ApiFailure(0, `the Airflow API server does not answer (${err.message}): is it running?`);
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    throw new ApiFailure(response.status, messageOf(response.status, data, text), data && data.kind);
  }
  return data;
}

function messageOf(status, data, text) {
  if (status === 401) return "Your Airflow session has expired or you are not logged in: log in to Airflow again.";
  if (data && typeof data.error === "string") return data.error;
  if (data && typeof data.detail === "string") return data.detail;
  if (data && Array.isArray(data.detail)) return data.detail.map((d) => `${(d.loc || []).join(".")}: ${d.msg}`).join("; ");
  return `HTTP ${status}${text && text.length < 300 ? `: ${text}` : ""}`;
}

const jobPath = (job) => `api/jobs/${encodeURIComponent(job)}`;

// --- the banner: what failed (store errors, refusals), as the API worded it -----------------------------

function setError(source, err) {
  if (err) state.errors.set(source, { message: err.message || String(err), kind: err.kind || source });
  else state.errors.delete(source);
  renderBanner();
}

function renderBanner() {
  const banner = $("banner");
  // one line per kind of failure: an unreachable store fails every read the same way
  const byKind = new Map();
  for (const { message, kind } of state.errors.values()) if (!byKind.has(kind)) byKind.set(kind, message);
  const lines = [...new Set(byKind.values())];
  banner.className = lines.length ? "" : "info";
  if (!lines.length && state.info) lines.push(state.info);
  banner.replaceChildren(...lines.flatMap((line, i) => (i ? [el("br"), line] : [line])));
  banner.hidden = lines.length === 0;
}

// `sticky`: stays until replaced (a run still in flight), else it goes after 15 s
function showInfo(message, { sticky = false } = {}) {
  state.info = message;
  renderBanner();
  clearTimeout(state.infoTimer);
  if (sticky) return;
  state.infoTimer = setTimeout(() => {
    state.info = "";
    renderBanner();
  }, 15000);
}

// --- formatting --------------------------------------------------------------------------------------

function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let value = n;
  let unit = 0;
  while (value >= 1000 && unit < units.length - 1) {
    value /= 1000;
    unit += 1;
  }
  return `${unit ? value.toFixed(value < 10 ? 1 : 0) : value} ${units[unit]}`;
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "";
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  if (seconds < 172800) return `${Math.round(seconds / 3600)} h`;
  return `${Math.round(seconds / 86400)} d`;
}

const badge = (value) => el("span", { class: `badge s-${value}` }, value);
const num = (value) => (value === null || value === undefined ? "" : Number(value).toLocaleString());

function copyButton(text) {
  return el("button", {
    type: "button",
    class: "small",
    onclick: async (event) => {
      const button = event.currentTarget;
      try {
        await navigator.clipboard.writeText(text);
      } catch {
        // no clipboard API outside secure contexts: copy through a selected field
        const field = el("textarea", { style: "position:fixed;opacity:0" }, text);
        document.body.append(field);
        field.select();
        document.execCommand("copy");
        field.remove();
      }
      button.textContent = "Copied";
      setTimeout(() => (button.textContent = "Copy"), 1500);
    },
  }, "Copy");
}

// --- the fleet: every job at a glance ------------------------------------------------------------------

function fleetValue(row, key) {
  if (key === "health") return [row.unhealthy || row.error ? 0 : 1, row.job];
  return row[key];
}

// Missing values (no deployment, no savepoint) sort last whichever the direction.
function compareRows(a, b) {
  const { key, descending } = state.fleetSort;
  const [x, y] = [fleetValue(a, key), fleetValue(b, key)];
  if (x === null || x === undefined) return y === null || y === undefined ? a.job.localeCompare(b.job) : 1;
  if (y === null || y === undefined) return -1;
  const order = Array.isArray(x) ? x[0] - y[0] || x[1].localeCompare(y[1])
    : typeof x === "number" ? x - y : String(x).localeCompare(String(y));
  return (descending ? -order : order) || a.job.localeCompare(b.job);
}

// A declared job (desired in the jobs file): what should run, and what the reconcile loop recorded of it.
function declaredText(d) {
  const notes = [d.desired];
  if (d.last_stable_version) notes.push(`last stable ${d.last_stable_version}`);
  notes.push(`${d.restarts_left} restart(s) left`);
  if (d.held_versions.length) notes.push(`held: ${d.held_versions.join(", ")}`);
  if (d.paused_by) notes.push(`paused by ${d.paused_by}`);
  if (d.autoscale) notes.push(autoscaleText(d.autoscale));
  return notes.join(" · ");
}

// The declared cell's tooltip: what the last apply did, and why the autoscaler recommends what it does.
function declaredTitle(d) {
  const rec = d.autoscale && d.autoscale.recommendation;
  return [d.last_step, rec ? `autoscale: ${rec.reason}` : ""].filter(Boolean).join("\n");
}

// The autoscaler in a few words (reconcile/apply.py _autoscale_status): its size on the knob within min..max, a
// different size it recommends, and what needs a person (behind at its max, a held scale-up).
function autoscaleText(a) {
  const rec = a.recommendation;
  const notes = [`${a.mode} autoscale: ${a.size ?? "-"} ${a.knob} (${a.min}..${a.max})`];
  if (rec && rec.size !== a.size) notes.push(`${rec.size} recommended`);
  if (rec && rec.behind_at_max) notes.push("behind at its max");
  if (a.scale_up_held) notes.push("scale-ups held");
  return notes.join(", ");
}

const stamp = (epoch) => new Date(epoch * 1000).toISOString().replace(/\.\d+Z$/, "Z");

// A rescale of the record (autoscale/decide.py Rescale): sizes, outcome, its time to the cutover.
function rescaleText(r) {
  const partitions = r.partitions ? `, state to ${r.partitions} partitions` : "";
  const took = r.seconds === null || r.seconds === undefined ? "" : ` in ${Math.round(r.seconds)} s`;
  const checked = r.effective === false ? ", ineffective" : r.effective ? ", effective" : "";
  return `${r.from_size} -> ${r.to_size}${partitions}: ${r.outcome || "under way"}${took}${checked} (${stamp(r.at)})`;
}

// The job's autoscaler (with the deployments): size, recommendation and why, passive or active, the last rescale,
// and a held scale-up with the command that clears it.
function renderAutoscale(a) {
  $("autoscale-section").hidden = !a;
  if (!a) return;
  const rec = a.recommendation;
  const retry = `savepoints apply ${state.job} --retry`;
  const acted = a.mode === "active" ? "" : " (passive: recommended, not acted on)";
  $("autoscale-status").replaceChildren(...[  // replaceChildren writes a null as "null": the absent ones left out
    el("p", {},
      badge(a.mode), ` size ${a.size ?? "- (not running)"} ${a.knob}, from ${a.min} to ${a.max}`,
      rec ? el("strong", {}, ` · recommended ${rec.size}`) : "",
      rec && ["up", "down"].includes(rec.direction) ? `: scale ${rec.direction}${acted}` : ""),
    rec ? el("p", { class: "small muted", "data-field": "reason" }, `${stamp(rec.at)}: ${rec.reason}`) : null,
    rec && rec.behind_at_max
      ? el("p", { class: "small error-text" }, "At its max size and still falling behind: raise autoscale.max, or " +
        "look for the bottleneck (a source, the sink, a skewed key).") : null,
    a.last_rescale ? el("p", { class: "small" }, `Last rescale ${rescaleText(a.last_rescale)}; ${a.rescales} recorded`)
      : null,
    a.scale_up_held ? el("p", { class: "small error-text", "data-field": "held" },
      `Scale-ups held: ${a.scale_up_held}. Clear with `, el("code", {}, retry), " ", copyButton(retry)) : null,
  ].filter(Boolean));
}

function renderFleet() {
  const rows = [...state.fleet].sort(compareRows);
  // "all healthy" only where something runs and all of it is healthy: the server's line (views.fleet_summary)
  const summary = state.fleetSummary;
  $("fleet-count").textContent = `${num(rows.length)}`;
  $("fleet-summary").replaceChildren(
    summary ? el("span", { class: summary.unhealthy ? "error-text" : "muted" }, summary.text) : "",
  );
  for (const button of document.querySelectorAll("#fleet-table th button.sort")) {
    const sorted = button.dataset.sort === state.fleetSort.key;
    button.setAttribute("aria-sort", sorted ? (state.fleetSort.descending ? "descending" : "ascending") : "none");
  }
  $("fleet-table").tBodies[0].replaceChildren(
    ...rows.map((r) =>
      el("tr", {
        "data-job": r.job,
        class: r.unhealthy || r.error ? "unhealthy" : "",
        tabindex: 0,
        title: `Open ${r.job}`,
        onclick: () => selectJob(r.job),
        onkeydown: (event) => {
          if (event.key === "Enter") selectJob(r.job);
        },
      },
        el("td", {},
          el("span", { class: "mono" }, r.job),
          r.unhealthy || r.error ? el("div", { class: "error-text small reason" }, r.error || r.unhealthy) : null,
        ),
        el("td", {},
          r.state === "NONE" ? el("span", { class: "never-deployed", title: "no deployment of it yet" }, "never deployed")
            : badge(r.state),
          r.version ? el("span", { class: "muted small" }, ` ${r.version}`) : null),
        el("td", { class: "num" }, num(r.last_batch_id)),
        el("td", { class: "num" }, r.heartbeat_age_s === null || r.heartbeat_age_s === undefined ? ""
          : `${age(r.heartbeat_age_s)} ago`),
        el("td", { class: "num", title: r.last_savepoint || "no COMPLETED savepoint" },
          r.last_savepoint_age_s === null || r.last_savepoint_age_s === undefined ? "none"
            : `${age(r.last_savepoint_age_s)} ago`),
        el("td", { class: "num" }, num(r.kafka_lag)),
        el("td", { class: r.failed_snapshots ? "num error-text" : "num" }, num(r.failed_snapshots)),
        el("td", { title: r.declared ? declaredTitle(r.declared) : "no desired state: left to people" },
          r.declared ? declaredText(r.declared) : ""),
      ),
    ),
  );
}

function sortFleet(key) {
  const same = state.fleetSort.key === key;
  state.fleetSort = { key, descending: same ? !state.fleetSort.descending : false };
  renderFleet();
}

async function loadFleet() {
  try {
    const data = await api("api/fleet");
    state.fleet = data.jobs;
    state.fleetSummary = data.summary;
    renderFleet();
    setError("fleet", null);
  } catch (err) {
    setError("fleet", err);
  }
}

function showFleet() {
  state.view = "fleet";
  state.job = "";
  state.errors.clear();
  history.replaceState(null, "", "?");
  $("job").hidden = true;
  $("fleet").hidden = false;
  renderNav();
  refresh();
}

// --- jobs --------------------------------------------------------------------------------------------

function renderNav() {
  $("to-fleet").hidden = state.jobs.length < 2 || state.view === "fleet";
  $("nav-job").textContent = state.view === "job" ? state.job : "";
}

// `focus`: a snapshot to open the job at (the page's ?snapshot=, the extra links)
function selectJob(name, { focus = "" } = {}) {
  if (name === state.job && state.view === "job") return;
  state.view = "job";
  state.job = name;
  state.offset = 0;
  state.focus = focus;
  state.highlight = focus;
  state.open.clear();
  state.errors.clear();
  state.savepoint = null;
  state.deploy = null;
  state.upgrade = null;
  state.followed = null;
  state.info = "";
  const query = focus ? { job: name, snapshot: focus } : { job: name };
  history.replaceState(null, "", `?${new URLSearchParams(query)}`);
  $("fleet").hidden = true;
  $("job").hidden = false;
  renderNav();
  refresh();
}

function renderJobHead() {
  const job = state.jobs.find((j) => j.name === state.job);
  $("job-name").textContent = job.name;
  $("job-desc").textContent = job.description || "";
  $("job-store").textContent = job.store;
  renderDeployForm(job);
  renderSavepointButton();
  renderUpgradeForm(job);
}

// The versions to deploy, the newest deployment's first chosen (a restart continues what ran), else the jobs
// file's default. Enabled like Take savepoint: the person may trigger the deploy DAG and nothing of the job runs
// (the engine's rule and reason, with the deployments), and no deploy this page triggered is still under way.
function renderDeployForm(job) {
  const select = $("deploy-version");
  if (select.dataset.job !== job.name) {
    select.replaceChildren(...job.versions.map((v) => el("option", { value: v }, v)));
    select.value = job.default_version;
    select.dataset.job = job.name;
    select.dataset.chosen = "";
  }
  const newest = (state.lastDeployments || [])[0];
  if (newest && !select.dataset.chosen && job.versions.includes(newest.version)) select.value = newest.version;
  const now = state.deploy;
  const deploying = state.followed && state.followed.dag === DEPLOY_DAG;
  let why = "";
  if (!state.me.can.deploy) why = `You may not trigger the ${DEPLOY_DAG} DAG: ask for permission to run it.`;
  else if (!now) why = "Checking for a running deployment…";
  else if (!now.possible) why = now.reason;
  else if (deploying) why = `Deploy run ${state.followed.run_id} is under way.`;
  $("deploy-button").disabled = why !== "" || state.triggering;
  $("deploy-button").className = why === "" ? "primary" : "";
  $("deploy-button").title = why || `Runs the ${DEPLOY_DAG} DAG for ${job.name}`;
  $("deploy-reason").textContent = why;
  $("deploy-reason").hidden = why === "";
}

// The versions to upgrade to: the job's, but the one running. Enabled like Take savepoint: the person may
// trigger the upgrade DAG, a deployment runs, and no upgrade of the job is under way.
function renderUpgradeForm(job) {
  const select = $("upgrade-version");
  const running = (state.lastDeployments || []).find((d) => d.state === "RUNNING");
  const choices = job.versions.filter((v) => !running || v !== running.version);
  if (select.dataset.job !== job.name || select.options.length !== choices.length) {
    select.replaceChildren(...choices.map((v) => el("option", { value: v }, v)));
    select.dataset.job = job.name;
  }
  const upgrade = state.upgrade;
  let why = "";
  if (!state.me.can.upgrade) why = `You may not trigger the ${UPGRADE_DAG} DAG: ask for permission to run it.`;
  else if (!running) {
    const coming = (state.lastDeployments || []).find((d) => IN_BETWEEN.includes(d.state));
    why = coming ? `Deployment ${coming.deployment} is ${coming.state}: an upgrade can begin once one runs.`
      : "No deployment is running: deploy one first.";
  }
  else if (upgrade && !upgrade.ended) why = `Upgrade ${upgrade.id} to ${upgrade.to_version} is under way.`;
  else if (!choices.length) why = "The jobs file declares no other version.";
  $("upgrade-button").disabled = why !== "" || state.triggering;
  $("upgrade-button").title = why || `Runs the ${UPGRADE_DAG} DAG for ${job.name}`;
  $("upgrade-reason").textContent = why;
  $("upgrade-reason").hidden = why === "";
}

function renderUpgrade(upgrade) {
  state.upgrade = upgrade;
  $("upgrade-section").hidden = !upgrade;
  if (!upgrade) return false;
  const outcome = upgrade.ended ? (upgrade.succeeded ? "success" : "failed") : "running";
  $("upgrade-status").replaceChildren(
    badge(upgrade.phase),
    upgrade.rescale ? ` ${upgrade.id}: ${upgrade.title} (${upgrade.to_version})`
      : ` ${upgrade.id}: ${upgrade.from_version || "?"} to ${upgrade.to_version}`,
    upgrade.mode ? ` (${upgrade.mode})` : "",
    el("div", { class: outcome === "failed" ? "error-text small" : "muted small" }, upgrade.error || upgrade.note),
    upgradePaths(upgrade),
  );
  return !upgrade.ended;
}

// What the pre-flight found for each mode: why it applies, or why not (the chosen one first).
function upgradePaths(upgrade) {
  const modes = Object.entries(upgrade.modes || {});
  if (!modes.length) return "";
  modes.sort(([a], [b]) => (b === upgrade.mode) - (a === upgrade.mode));
  return el(
    "ul",
    { class: "small upgrade-paths" },
    ...modes.map(([mode, reason]) =>
      el("li", { class: mode === upgrade.mode ? "" : "muted" }, el("strong", {}, mode), `: ${reason}`),
    ),
  );
}

// Enabled only when the person may trigger the DAG AND a deployment runs; otherwise it says why, in words
// (a disabled button's tooltip is easy to miss). `state.savepoint` comes with the deployments (the engine's
// own rule and message); until they are loaded the button waits.
function renderSavepointButton() {
  const button = $("savepoint-button");
  const reason = $("savepoint-reason");
  const now = state.savepoint;
  let why = "";
  if (!state.me.can.trigger) why = `You may not trigger the ${SAVEPOINT_DAG} DAG: ask for permission to run it.`;
  else if (!now) why = "Checking for a running deployment…";
  else if (!now.possible) why = now.reason;
  button.disabled = why !== "" || state.triggering;
  button.title = why || `Runs the ${SAVEPOINT_DAG} DAG for ${state.job} (deployment ${now.deployment})`;
  reason.textContent = why;
  reason.hidden = why === "";
}

// --- deployments -------------------------------------------------------------------------------------

function renderDeployments(rows) {
  const empty = $("deployments-empty");
  const table = $("deployments");
  empty.hidden = rows.length > 0;
  table.hidden = rows.length === 0;
  if (!rows.length) {
    empty.replaceChildren(
      `No deployment of ${state.job} yet. Start one with Deploy above (the ${DEPLOY_DAG} DAG) or `,
      el("code", {}, `savepoints deploy ${state.job}`),
      ".",
    );
    return;
  }
  table.tBodies[0].replaceChildren(
    ...rows.map((d) =>
      el("tr", { "data-id": d.deployment },
        el("td", { class: "mono", title: d.checkpoint || "" }, d.deployment),
        el("td", {}, d.version),
        el("td", {},
          badge(d.state),
          d.unhealthy ? [" ", badge("UNHEALTHY")] : null,
          d.error || d.unhealthy ? el("div", { class: "error-text small" }, d.error || d.unhealthy) : null,
          d.gate ? el("div", { class: "small gate" }, d.gate) : null,
          d.driver === "cannot tell" || (d.driver === "gone" && d.state !== "STOPPED")
            ? el("div", { class: "small" }, `driver process: ${d.driver} from here`) : null,
        ),
        el("td", { class: "num" }, d.heartbeat_age_s === null ? "none" : `${age(d.heartbeat_age_s)} ago`),
        el("td", { class: "num" }, num(d.last_batch_id)),
        el("td", { class: "num" }, d.rows_per_second === null ? "" : num(Math.round(d.rows_per_second))),
        el("td", { class: "num" }, d.kafka_lag === null || d.kafka_lag === undefined ? "" : num(d.kafka_lag)),
        el("td", { class: "mono" }, d.restored_from || ""),
      ),
    ),
  );
}

// --- runs of the savepoint DAG -----------------------------------------------------------------------

function renderRuns(runs) {
  $("runs-section").hidden = runs.length === 0;
  $("runs").replaceChildren(
    ...runs.slice(0, 5).map((run) =>
      el("li", {},
        badge(run.state),
        el("a", {
          href: `../dags/${SAVEPOINT_DAG}/runs/${encodeURIComponent(run.run_id)}`,
          target: "_top",
          class: "mono",
        }, run.run_id),
        el("span", { class: "muted small" },
          `by ${run.triggering_user || "?"}${run.stop ? ", stop afterwards" : ""}${run.pin ? ", pin" : ""}` +
            `${run.label ? `, ${run.label}` : ""}`),
      ),
    ),
  );
  followRun(SAVEPOINT_DAG, runs);
  return runs.some((run) => run.state === "queued" || run.state === "running");
}

// the banner after "Take savepoint" or "Deploy" says where its run is, not "queued" once it has long succeeded
const RUN_WORDS = {
  [SAVEPOINT_DAG]: {
    success: "succeeded: its savepoint is in the list below.",
    running: "is running: the savepoint is being taken.",
    queued: "queued: the new snapshot appears below when its task starts.",
  },
  [DEPLOY_DAG]: {
    success: "succeeded: the deployment is healthy.",
    running: "is running: the deployment starts (below), then the run waits until it is healthy.",
    queued: "queued: the new deployment appears below when its task starts.",
  },
};

function runMessage(dag, run, paused) {
  const id = run.run_id;
  const words = RUN_WORDS[dag];
  const prefix = dag === DEPLOY_DAG ? "Deploy run" : "Run";
  if (run.state === "failed") {
    return el("span", {}, `${prefix} ${id} failed: `,
      el("a", { href: `../dags/${dag}/runs/${encodeURIComponent(id)}`, target: "_top" }, "open it in Airflow"),
      " for the task's log.");
  }
  if (run.state === "success" || run.state === "running") return `${prefix} ${id} ${words[run.state]}`;
  return paused
    ? `${prefix} ${id} is queued, but the ${dag} DAG is paused: unpause it in Airflow.`
    : `${prefix} ${id} ${words.queued}`;
}

function followRun(dag, runs) {
  if (!state.followed || state.followed.dag !== dag) return;
  const run = runs.find((r) => r.run_id === state.followed.run_id);
  if (!run) return;
  const ended = run.state === "success" || run.state === "failed";
  showInfo(runMessage(dag, run, state.followed.dag_paused), { sticky: !ended });
  if (ended) state.followed = null;
}

// --- snapshots ---------------------------------------------------------------------------------------

// Kafka positions against the broker: "-" without a Kafka source, else ok, unchecked, or the records gone
function sourceCell(check) {
  if (!check) return el("td", { class: "muted" }, "–");
  if (!check.checked) return el("td", { class: "muted", title: check.note }, "unchecked");
  if (check.restorable) return el("td", { title: check.summary }, "ok");
  const lost = `${num(check.records_lost)}${check.lost_unknown ? "+" : ""} records gone`;
  const where = check.partitions.filter((p) => p.state !== "ok").map((p) => `${p.topic}-${p.partition}: ${p.state}`);
  return el("td", { class: "error-text source-gone", title: `cannot be restored without a gap\n${where.join("\n")}` },
    lost);
}

function positionsText(positions) {
  return (positions || []).map((p) => p.kind === "kafka"
    ? Object.entries(p.offset).map(([topic, parts]) =>
      `${topic} ${Object.entries(parts).map(([part, offset]) => `${part}:${offset}`).join(", ")}`).join("; ")
    : `${p.kind} ${JSON.stringify(p.offset)}`).join(" | ");
}

function snapshotRows(s) {
  const can = state.me.can;
  const open = state.open.has(s.id);
  const row = el("tr", { "data-id": s.id, "data-status": s.status, class: s.id === state.highlight ? "focus" : "" },
    el("td", { class: "mono", title: s.created_at }, s.id),
    el("td", {}, s.kind),
    el("td", {}, s.trigger),
    el("td", {}, badge(s.status)),
    el("td", { class: "num" }, num(s.batch_id)),
    el("td", { class: "num", title: `${num(s.files)} files` }, bytes(s.bytes)),
    el("td", { class: "num" }, bytes(s.uploaded_bytes)),
    el("td", { class: "num", title: s.created_at }, age(s.age_s)),
    el("td", {},
      el("button", {
        type: "button",
        class: "small pin",
        disabled: !can.pin,
        title: can.pin ? (s.pinned ? "Unpin: retention may delete it again" : "Pin: retention never deletes it")
          : `Pinning needs permission to trigger the ${SAVEPOINT_DAG} DAG`,
        onclick: () => setPinned(s, !s.pinned),
      }, s.pinned ? "pinned" : "pin"),
    ),
    el("td", { title: s.verified === null ? "not verified yet" : "" },
      s.verified === true ? "yes" : s.verified === false ? el("span", { class: "error-text" }, "FAILED") : "–"),
    sourceCell(s.source_check),
    el("td", {},
      el("button", {
        type: "button",
        class: "small",
        "aria-expanded": open ? "true" : "false",
        onclick: () => {
          if (state.open.has(s.id)) state.open.delete(s.id);
          else state.open.add(s.id);
          renderSnapshots(state.lastSnapshots);
        },
      }, s.status === "COMPLETED" ? "Restore…" : "Details…"),
    ),
  );
  if (!open) return [row];
  const commands = Object.entries(s.commands || {});
  const details = el("tr", { class: "details" },
    el("td", { colspan: 12 },
      s.error ? el("p", { class: "error-text" }, s.error) : null,
      s.source_positions && s.source_positions.length
        ? el("p", { class: "small" }, "Source positions at its batch (next offsets): ", positionsText(s.source_positions))
        : null,
      s.source_check && s.source_check.checked && !s.source_check.restorable
        ? el("p", { class: "error-text small" }, `Kafka: ${s.source_check.summary}. Restoring it needs ` +
          "--accept-source-gap (the gap is recorded).")
        : null,
      (s.history || []).map((h) => el("p", { class: "small muted" }, `${h.at}: ${h.event} (${h.summary || ""})`)),
      s.labels && Object.keys(s.labels).length
        ? el("p", { class: "small" }, "Labels: ", Object.entries(s.labels).map(([k, v]) => `${k}=${v}`).join(", "))
        : null,
      el("p", { class: "small muted" },
        `Deployment ${s.deployment || "none"}, version ${s.job_version || "?"}, ${num(s.files)} files, ` +
          `created ${s.created_at}${s.completed_at ? `, completed ${s.completed_at}` : ""}`),
      el("div", { class: "commands" },
        commands.flatMap(([name, command]) => [
          el("span", { class: "small muted" }, name),
          el("input", { type: "text", readonly: true, value: command, "aria-label": `${name} command` }),
          copyButton(command),
        ]),
      ),
    ),
  );
  return [row, details];
}

function renderSnapshots(page) {
  state.lastSnapshots = page;
  const empty = $("snapshots-empty");
  const table = $("snapshots");
  const filtered = state.kind || state.status;
  $("snap-count").textContent = page.all ? `${num(page.total)}${filtered ? ` of ${num(page.all)}` : ""}` : "";
  empty.hidden = page.total > 0;
  table.hidden = page.total === 0;
  $("pager").hidden = page.total <= page.limit;
  if (page.total === 0) {
    empty.replaceChildren(
      page.all
        ? "No snapshot matches these filters."
        : `No snapshots of ${state.job} yet. Take one with “Take savepoint” above, or with `,
      page.all ? "" : el("code", {}, `savepoints create ${state.job} --checkpoint LOCATION`),
      page.all ? "" : ".",
    );
  }
  table.tBodies[0].replaceChildren(...page.snapshots.flatMap(snapshotRows));
  const last = Math.min(page.offset + page.limit, page.total);
  $("page-info").textContent = `${num(page.offset + 1)}–${num(last)} of ${num(page.total)}`;
  $("prev").disabled = page.offset === 0;
  $("next").disabled = last >= page.total;
  renderTimeline(page.timeline);
  renderState(page.timeline);
  return page.snapshots.some((s) => s.status === "IN_PROGRESS");
}

async function setPinned(snapshot, pinned) {
  try {
    await api(`${jobPath(state.job)}/snapshots/${encodeURIComponent(snapshot.id)}/pin`, {
      method: "PUT",
      body: { pinned },
    });
    setError("action", null);
  } catch (err) {
    setError("action", err);
  }
  refresh();
}

// --- timeline: every snapshot by time (x) and batch (y), and each deployment's progress from its start ----

// A deployment's path through (time, batch): from its start (the batch it was restored at, else 0), through its
// own COMPLETED snapshots, to its last heartbeat's batch: the batches before its first snapshot show too.
function deploymentPath(d, points, now) {
  const path = [[Date.parse(d.created_at), d.restored_batch_id ?? 0]];
  for (const p of points) {
    if (p.deployment === d.deployment && p.status === "COMPLETED" && p.batch_id !== null) {
      path.push([Date.parse(p.created_at), p.batch_id]);
    }
  }
  if (d.last_batch_id !== null && d.heartbeat_age_s !== null) path.push([now - d.heartbeat_age_s * 1000, d.last_batch_id]);
  return path.sort((a, b) => a[0] - b[0]);
}

// The axes of a chart in a W x H view box with these margins, the y axis labelled 0 and `yLabel` at `yMax`.
function axes({ W, H, left, right, top, bottom }, y, yMax, yLabel) {
  return [
    svg("line", { class: "axis", x1: left, y1: H - bottom, x2: W - right, y2: H - bottom }),
    svg("line", { class: "axis", x1: left, y1: top, x2: left, y2: H - bottom }),
    svg("text", { x: left - 6, y: y(0) + 4, "text-anchor": "end" }, "0"),
    svg("text", { x: left - 6, y: y(yMax) + 4, "text-anchor": "end" }, yLabel),
  ];
}

function renderTimeline(points) {
  const chart = $("timeline");
  const box = { W: 900, H: 200, left: 56, right: 16, top: 26, bottom: 28 };
  const { W, H, left, right, top, bottom } = box;
  const times = points.map((p) => Date.parse(p.created_at));
  const now = Date.now();
  const deployments = (state.lastDeployments || []).filter((d) => d.created_at);
  const paths = deployments.map((d) => ({ d, path: deploymentPath(d, points, now) }));
  const live = deployments.find((d) => ["RUNNING", "STARTING", "STOPPING"].includes(d.state));
  const starts = paths.map(({ path }) => path[0][0]);
  const t0 = times.length || starts.length ? Math.min(...times, ...starts) : now - 3600e3;
  const t1 = Math.max(now, ...times);
  const batches = [...points.map((p) => p.batch_id ?? 0), ...paths.flatMap(({ path }) => path.map(([, b]) => b))];
  const maxBatch = Math.max(1, ...batches);
  const x = (t) => left + ((t - t0) / Math.max(1, t1 - t0)) * (W - left - right);
  const y = (b) => H - bottom - (b / maxBatch) * (H - top - bottom);
  const nodes = [
    ...axes(box, y, maxBatch, `batch ${maxBatch}`),
    svg("text", { x: left, y: H - 8 }, new Date(t0).toLocaleString()),
    svg("text", { x: W - right, y: H - 8, "text-anchor": "end" }, "now"),
  ];
  if (!points.length) {
    nodes.push(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no snapshots yet"));
  }
  // snapshots of no listed deployment (taken of an unmanaged checkpoint): joined as before
  const listed = new Set(deployments.map((d) => d.deployment));
  const loose = points.filter((p) => p.status === "COMPLETED" && p.batch_id !== null && !listed.has(p.deployment));
  if (loose.length > 1) {
    const path = loose.map((p) => `${x(Date.parse(p.created_at)).toFixed(1)},${y(p.batch_id).toFixed(1)}`);
    nodes.push(svg("polyline", { class: "progress", points: path.join(" ") }));
  }
  for (const { d, path } of paths) {
    if (path.length < 2) continue;
    const line = path.map(([t, b]) => `${x(t).toFixed(1)},${y(b).toFixed(1)}`).join(" ");
    nodes.push(svg("polyline", { class: d === live ? "live" : "progress", points: line, "data-deployment": d.deployment }));
  }
  if (live && live.last_batch_id !== null && live.heartbeat_age_s !== null) {
    const xl = x(now - live.heartbeat_age_s * 1000);
    nodes.push(svg("text", { x: Math.min(xl, W - right - 4), y: y(live.last_batch_id) - 6, "text-anchor": "end" },
      `${live.deployment}: batch ${live.last_batch_id}`));
  }
  const colour = { COMPLETED: "var(--ok)", IN_PROGRESS: "var(--warn)", FAILED: "var(--bad)" };
  points.forEach((p, i) => {
    const cx = x(times[i]);
    const cy = y(p.batch_id ?? 0);
    const c = colour[p.status] || "var(--muted)";
    const savepoint = p.kind === "savepoint";
    nodes.push(
      svg("circle", {
        cx, cy, r: p.id === state.highlight ? 6 : 4,
        fill: savepoint ? c : "var(--bg)",
        stroke: c,
        "stroke-width": 2,
        "data-id": p.id,
        onclick: () => focusSnapshot(p.id),
      }, svg("title", {}, `${p.id}\n${p.kind}, ${p.status}, batch ${p.batch_id ?? "?"}\n${p.created_at}`)),
    );
    if (p.pinned) nodes.push(svg("circle", { class: "pin-ring", cx, cy, r: 8 }));
  });
  chart.replaceChildren(...nodes);
}

// --- state: each stateful operator's state bytes over the snapshots (recorded at snapshot time, no Spark) -

const operatorName = (op) => `operator ${op.id}${op.name ? ` (${op.name})` : ""}`;

function renderState(points) {
  const recorded = points.filter((p) => p.status === "COMPLETED" && p.state && p.state.length);
  $("state-section").hidden = recorded.length === 0;
  if (!recorded.length) return;
  const box = { W: 900, H: 160, left: 70, right: 16, top: 16, bottom: 24 };
  const { W, H, left, right, top, bottom } = box;
  const times = recorded.map((p) => Date.parse(p.created_at));
  const t0 = Math.min(...times);
  const t1 = Math.max(t0 + 1, ...times);
  const maxBytes = Math.max(1, ...recorded.flatMap((p) => p.state.map((op) => op.bytes || 0)));
  const x = (t) => left + ((t - t0) / (t1 - t0)) * (W - left - right);
  const y = (b) => H - bottom - (b / maxBytes) * (H - top - bottom);
  const ids = [...new Set(recorded.flatMap((p) => p.state.map((op) => op.id)))].sort((a, b) => a - b);
  const colours = ["var(--accent)", "var(--ok)", "var(--warn)", "var(--bad)", "var(--fg)"];
  const nodes = axes(box, y, maxBytes, bytes(maxBytes));
  ids.forEach((id, i) => {
    const series = recorded
      .map((p, j) => [times[j], p.state.find((op) => op.id === id)])
      .filter(([, op]) => op);
    const line = series.map(([t, op]) => `${x(t).toFixed(1)},${y(op.bytes || 0).toFixed(1)}`).join(" ");
    const last = series[series.length - 1][1];
    const rows = last.rows === null || last.rows === undefined ? "" : `, ${num(last.rows)} rows`;
    nodes.push(svg("polyline", { points: line, stroke: colours[i % colours.length], "data-operator": id },
      svg("title", {}, `${operatorName(last)}: ${bytes(last.bytes)}${rows}`)));
    nodes.push(svg("text", { x: W - right, y: top + 12 * (i + 1), "text-anchor": "end", fill: colours[i % colours.length] },
      `${operatorName(last)}: ${bytes(last.bytes)}${rows}`));
  });
  $("state-chart").replaceChildren(...nodes);
  // the skew of the newest snapshot: its largest partitions by bytes against the mean
  const newest = recorded[recorded.length - 1];
  $("state-skew").replaceChildren(
    `Skew at ${newest.id}: `,
    ...newest.state.map((op, i) => {
      const spread = op.skew || {};
      const largest = (spread.largest || []).map(([p, b]) => `partition ${p} ${bytes(b)}`).join(", ");
      const ratio = spread.ratio === null || spread.ratio === undefined ? "-" : `${spread.ratio}×`;
      return `${i ? "; " : ""}${operatorName(op)}: largest/mean ${ratio} (${largest || "no files"})`;
    }),
  );
}

function focusSnapshot(id) {
  state.focus = id;
  state.highlight = id;
  state.kind = state.status = "";
  $("filter-kind").value = $("filter-status").value = "";
  history.replaceState(null, "", `?${new URLSearchParams({ job: state.job, snapshot: id })}`);
  refresh();
}

// --- loading and polling -----------------------------------------------------------------------------

async function loadDeployments() {
  try {
    const data = await api(`${jobPath(state.job)}/deployments`);
    state.lastDeployments = data.deployments;
    state.savepoint = data.savepoint;
    state.deploy = data.deploy;
    renderDeployments(data.deployments);
    renderAutoscale(data.autoscale);
    $("deployments-older").textContent = data.older ? `(and ${num(data.older)} older retired ones)` : "";
    setError("deployments", null);
  } catch (err) {
    setError("deployments", err);
    state.lastDeployments = [];
    const unknown = { possible: false, reason: "Deployments not available: see the message above." };
    state.savepoint = state.deploy = unknown;
    unavailable("deployments", "Deployments not available: see the message above.");
  }
  renderSavepointButton();
  return state.lastDeployments.some((d) => IN_BETWEEN.includes(d.state));
}

function unavailable(table, message) {
  $(table).hidden = true;
  const line = $(`${table}-empty`);
  line.replaceChildren(message);
  line.hidden = false;
}

async function loadSnapshots() {
  const query = new URLSearchParams({ offset: state.offset, limit: LIMIT });
  if (state.focus) query.set("focus", state.focus);
  if (state.kind) query.set("kind", state.kind);
  if (state.status) query.set("status", state.status);
  try {
    const page = await api(`${jobPath(state.job)}/snapshots?${query}`);
    state.offset = page.offset;
    if (state.focus) {
      if (page.focus_found === false) {
        setError("focus", new Error(`snapshot ${state.focus} of ${state.job} is not in the store (deleted?)`));
      } else {
        setError("focus", null);
        state.open.add(state.focus);
      }
    }
    const busy = renderSnapshots(page);
    if (state.focus && page.focus_found) {
      const wanted = state.focus;
      requestAnimationFrame(() => {
        const row = document.querySelector(`#snapshots tr[data-id="${CSS.escape(wanted)}"]`);
        if (row) row.scrollIntoView({ block: "center" });
      });
    }
    state.focus = "";
    setError("snapshots", null);
    return busy;
  } catch (err) {
    setError("snapshots", err);
    unavailable("snapshots", "Snapshots not available: see the message above.");
    $("pager").hidden = true;
    $("snap-count").textContent = "";
    $("timeline").replaceChildren(
      svg("text", { x: 450, y: 100, "text-anchor": "middle" }, "not available: see the message above"),
    );
    return false;
  }
}

async function loadRuns() {
  const [savepoints, deploys] = await Promise.all([loadSavepointRuns(), loadDeployRun()]);
  return savepoints || deploys;
}

async function loadSavepointRuns() {
  if (!state.me.can.read_runs) return false;
  try {
    const data = await api(`${jobPath(state.job)}/runs`);
    setError("runs", null);
    return renderRuns(data.runs);
  } catch (err) {
    setError("runs", err);
    return false;
  }
}

// the deploy run this page triggered, followed in the banner until it ends
async function loadDeployRun() {
  if (!state.followed || state.followed.dag !== DEPLOY_DAG) return false;
  try {
    const data = await api(`${jobPath(state.job)}/deploy-runs`);
    setError("deploy-runs", null);
    followRun(DEPLOY_DAG, data.runs);
    return Boolean(state.followed);
  } catch (err) {
    setError("deploy-runs", err);
    return false;
  }
}

async function loadUpgrade() {
  try {
    const data = await api(`${jobPath(state.job)}/upgrades`);
    setError("upgrade", null);
    return renderUpgrade(data.newest);
  } catch (err) {
    setError("upgrade", err);
    return false;
  }
}

async function refresh() {
  clearTimeout(state.timer);
  if (state.view === "fleet") {
    await loadFleet();
    if (state.view === "fleet") schedule();
    return;
  }
  if (!state.job) return;
  renderJobHead();
  const job = state.job;
  // deployments first: the timeline draws the running deployment's progress
  const [busyDeployments, busyRuns, busyUpgrade] = await Promise.all([loadDeployments(), loadRuns(), loadUpgrade()]);
  renderJobHead();
  const busySnapshots = await loadSnapshots();
  if (job !== state.job) return; // another job was selected meanwhile: its own refresh is under way
  state.busy = busyDeployments || busyRuns || busySnapshots || busyUpgrade;
  schedule();
}

function schedule() {
  clearTimeout(state.timer);
  state.timer = setTimeout(() => {
    if (document.visibilityState === "hidden") schedule();
    else refresh();
  }, state.busy ? POLL_BUSY_MS : POLL_IDLE_MS);
}

async function triggerSavepoint(event) {
  event.preventDefault();
  const form = event.currentTarget;
  state.triggering = true;
  renderSavepointButton();
  try {
    const run = await api(`${jobPath(state.job)}/savepoints`, {
      method: "POST",
      body: { stop: form.stop.checked, pin: form.pin.checked, label: form.label.value.trim() },
    });
    setError("action", null);
    // followed in the banner when this user may read the runs (else the message goes after 15 s)
    state.followed = state.me.can.read_runs ? { dag: SAVEPOINT_DAG, run_id: run.run_id, dag_paused: run.dag_paused }
      : null;
    showInfo(runMessage(SAVEPOINT_DAG, run, run.dag_paused), { sticky: Boolean(state.followed) });
    form.reset();
  } catch (err) {
    setError("action", err);
  } finally {
    state.triggering = false;
    renderSavepointButton();
  }
  state.offset = 0;
  state.busy = true;
  refresh();
}

async function triggerDeploy(event) {
  event.preventDefault();
  const form = event.currentTarget;
  state.triggering = true;
  renderJobHead();
  try {
    const run = await api(`${jobPath(state.job)}/deployments`, {
      method: "POST",
      body: { version: form.version.value, restore: form.restore.value },
    });
    setError("action", null);
    // followed in the banner when this user may read the deploy DAG's runs (else the message goes after 15 s)
    const followed = { dag: DEPLOY_DAG, run_id: run.run_id, dag_paused: run.dag_paused };
    state.followed = state.me.can.read_deploy_runs ? followed : null;
    showInfo(runMessage(DEPLOY_DAG, run, run.dag_paused), { sticky: Boolean(state.followed) });
  } catch (err) {
    setError("action", err);
  } finally {
    state.triggering = false;
    renderJobHead();
  }
  state.busy = true;
  refresh();
}

async function triggerUpgrade(event) {
  event.preventDefault();
  const form = event.currentTarget;
  state.triggering = true;
  renderJobHead();
  try {
    const run = await api(`${jobPath(state.job)}/upgrades`, {
      method: "POST",
      body: { version: form.version.value, mode: form.mode.value },
    });
    setError("action", null);
    showInfo(
      run.dag_paused
        ? `Run ${run.run_id} is queued, but the ${UPGRADE_DAG} DAG is paused: unpause it in Airflow.`
        : `Upgrade run ${run.run_id} queued: its progress shows below once it begins.`,
    );
  } catch (err) {
    setError("action", err);
  } finally {
    state.triggering = false;
    renderJobHead();
  }
  state.busy = true;
  refresh();
}

async function start() {
  $("savepoint-form").addEventListener("submit", triggerSavepoint);
  $("upgrade-form").addEventListener("submit", triggerUpgrade);
  $("deploy-form").addEventListener("submit", triggerDeploy);
  $("deploy-version").addEventListener("change", (event) => {
    event.currentTarget.dataset.chosen = "1"; // the person's choice stays; else the newest deployment's version
  });
  $("prev").addEventListener("click", () => {
    state.offset = Math.max(0, state.offset - LIMIT);
    refresh();
  });
  $("next").addEventListener("click", () => {
    state.offset += LIMIT;
    refresh();
  });
  for (const [id, key] of [["filter-kind", "kind"], ["filter-status", "status"]]) {
    $(id).addEventListener("change", (event) => {
      state[key] = event.currentTarget.value;
      state.offset = 0;
      refresh();
    });
  }
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible" && state.view) refresh();
  });
  $("to-fleet").addEventListener("click", showFleet);
  for (const button of document.querySelectorAll("#fleet-table th button.sort")) {
    button.addEventListener("click", () => sortFleet(button.dataset.sort));
  }
  try {
    const [me, jobs] = await Promise.all([api("api/me"), api("api/jobs")]);
    state.me = me;
    state.jobs = jobs.jobs;
    state.jobsFile = jobs.jobs_file;
  } catch (err) {
    $("loading").hidden = true;
    setError("start", err);
    return;
  }
  $("loading").hidden = true;
  $("user").textContent = `Logged in as ${state.me.user}`;
  if (!state.jobs.length) {
    $("jobs-file").textContent = state.jobsFile;
    $("no-jobs").hidden = false;
    return;
  }
  const asked = state.job;
  const focus = state.focus;
  state.job = "";
  if (state.jobs.some((j) => j.name === asked)) selectJob(asked, { focus });
  else if (state.jobs.length === 1) selectJob(state.jobs[0].name);
  else showFleet();
  if (asked && !state.jobs.some((j) => j.name === asked)) {
    setError("job", new Error(`job ${asked} is not declared in ${state.jobsFile}`));
  }
}

start();
