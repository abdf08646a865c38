// fetch JSON (no cache, the page's labeller token); the status line; why the page is empty
async function fetchJSON(url, options) {
  options = Object.assign({cache: "no-store", credentials: "same-origin"}, options || {});
  options.headers = Object.assign({"X-Labeller": CONFIG.token}, options.headers || {});
  const response = await fetch(url, options);
  let body = {};
  try { body = await response.json(); } catch (e) { body = {}; }
  return {ok: response.ok, status: response.status, body: body};
}
const format = (n) => Number(n).toLocaleString("en-US");
let lastStatus = null;
async function refreshStatus() {  // every second: the counts as the server has them now
  let r = null;
  try { r = await fetchJSON(api + "/status"); } catch (e) { /* unreachable */ }
  lastStatus = r && r.ok ? r.body : null;
  $("status").classList.toggle("down", !lastStatus);
  if (!lastStatus) {
    $("status").textContent = r ? r.body.error || "error " + r.status : "The labelling server does not answer: "
      + "the training run has stopped or is restarting. This page retries every second.";
  } else {
    const st = lastStatus.status, parts = [], age = lastStatus.now - st.updated;
    if ("budget" in st) parts.push("Labels given: " + format(lastStatus.answers) + " of " + format(st.budget));
    if (st.agent) parts.push("The agent: " + st.agent);
    if (age > 10) parts.push("last heard from the training run " + Math.round(age) + " s ago");
    if (CONFIG.kind) parts.push("Ready to label now: " + lastStatus.pending[CONFIG.kind]);
    $("status").textContent = parts.join("  \u00b7  ");
  }
  explainEmpty();
}
function explainEmpty() {  // why there is nothing to label: the budget, the other page, or the agent
  if (!CONFIG.kind || $("empty").hidden) return;
  const box = $("empty"), text = $("empty-text"), waited = Math.round((Date.now() - emptySince) / 1000);
  const st = lastStatus ? lastStatus.status : {}, wanted = lastStatus && lastStatus.kind;
  text.textContent = "";
  if (!lastStatus) {
    box.dataset.state = "unreachable";
    text.textContent = "Nothing to label: the labelling server does not answer (see above).";
  } else if (wanted !== CONFIG.kind) {
    const [view, title] = wanted === "pair" ? ["compare", "Compare pairs"] : ["sort", "Sort clips into the tree"];
    const link = document.createElement("a");
    link.href = location.pathname.replace(/[^/]+$/, view);
    link.textContent = title;
    box.dataset.state = "mode";
    text.append("This run asks for " + lastStatus.feedback + " answers, so nothing comes to this page: go to ",
                link, ".");
  } else if ("budget" in st && lastStatus.answers >= st.budget) {
    box.dataset.state = "budget";
    text.textContent = "The label budget is spent: all " + format(st.budget) + " labels are given, so the "
      + "agent asks nothing more. To give more, run the training again with a larger --labels.budget "
      + "(the same --run-dir resumes it).";
  } else {
    box.dataset.state = "waiting";
    text.textContent = "Waiting for the agent, busy with: " + (st.agent || "starting up") + ". Nothing to label "
      + "for " + waited + " s so far; the next clips show here as soon as the agent asks.";
  }
}
