// Live follow of the Logs page: asks logs/tail for the lines after the page's cursor every few seconds and
// appends them (the page works without it: the filter form reloads the page).
(function () {
  "use strict";
  var table = document.getElementById("log-lines");
  if (!table) return;
  var body = table.tBodies[0];
  var status = document.getElementById("logs-follow-status");
  var cursor = table.dataset.cursor;
  var maxRows = parseInt(table.dataset.lines, 10) || 500;
  var interval = parseInt(table.dataset.intervalMs, 10) || 3000;
  var busy = false;

  function cell(text, className) {
    var td = document.createElement("td");
    if (className) td.className = className;
    td.textContent = text;
    return td;
  }

  function row(entry) {
    var tr = document.createElement("tr");
    tr.className = "log-" + (entry.level || "").toLowerCase();
    tr.appendChild(cell(entry.time, "muted"));
    tr.appendChild(cell(entry.level));
    tr.appendChild(cell(entry.process, "muted"));
    tr.appendChild(cell(entry.logger, "muted"));
    var message = document.createElement("td");
    var pre = document.createElement("pre");
    pre.className = "log-message";
    pre.textContent = entry.message;
    message.appendChild(pre);
    if (entry.context) {
      var context = document.createElement("div");
      context.className = "muted";
      context.textContent = entry.context;
      message.appendChild(context);
    }
    tr.appendChild(message);
    return tr;
  }

  function poll() {
    if (busy || document.hidden) return;
    busy = true;
    var url = table.dataset.followUrl + "?cursor=" + encodeURIComponent(cursor) +
      "&level=" + encodeURIComponent(table.dataset.level || "");
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.json();
      })
      .then(function (answer) {
        if (answer.reset) {
          while (body.firstChild) body.removeChild(body.firstChild);
        }
        answer.entries.forEach(function (entry) { body.appendChild(row(entry)); });
        while (body.rows.length > maxRows) body.deleteRow(0);
        if (answer.entries.length) {
          var empty = document.getElementById("log-empty");
          if (empty) empty.hidden = true;
        }
        cursor = answer.cursor;
        if (status) status.textContent = "Following.";
      })
      .catch(function () {
        if (status) status.textContent = "Following paused: the gateway did not answer; retrying.";
      })
      .then(function () { busy = false; });
  }

  setInterval(poll, interval);
})();
