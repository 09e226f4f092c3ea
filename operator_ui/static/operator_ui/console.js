// Live updates for the console's pages: the server pushes session events over /ui/live/; the page
// swaps in the parts that changed (fetched once per event burst, never on a timer).
(function () {
  "use strict";
  var body = document.body;
  var sessionKey = body.dataset.sessionKey || null;
  var liveRegions = Array.prototype.slice.call(document.querySelectorAll("[data-live-region]"));
  // A staff user's header counts the pending exec approvals: every page of theirs follows those events.
  var approvalsBadge = document.querySelector('[data-live-region="approvals-badge"]');
  var APPROVAL_EVENTS = ["exec.approval.requested", "exec.approval.resolved"];
  var pageRegions = liveRegions.filter(function (region) { return region !== approvalsBadge; });
  // A page other than the sessions' names its socket topics and the events that refresh its parts.
  var topics = (body.dataset.liveTopics || (sessionKey || pageRegions.length ? "sessions" : ""))
    .split(",").filter(Boolean);
  if (approvalsBadge && topics.indexOf("approvals") === -1) topics.push("approvals");
  var liveEvents = (body.dataset.liveEvents || "").split(" ").filter(Boolean);
  if (topics.length === 0) return;

  var refreshTimer = null;
  function refreshRegions() {
    // Several events in a burst (a turn's end, its session change) cost one fetch.
    if (refreshTimer) return;
    refreshTimer = setTimeout(function () {
      refreshTimer = null;
      fetch(window.location.href, { credentials: "same-origin", headers: { "X-Requested-With": "console" } })
        .then(function (response) { return response.ok ? response.text() : null; })
        .then(function (html) {
          if (!html) return;
          var fresh = new DOMParser().parseFromString(html, "text/html");
          liveRegions.forEach(function (region) {
            var replacement = fresh.querySelector('[data-live-region="' + region.dataset.liveRegion + '"]');
            // Unchanged text is left alone (a screen reader would announce it again).
            if (!replacement || region.innerHTML === replacement.innerHTML) return;
            // A keyboard user's focus stays on the same control when its part is swapped in anew.
            var focused = document.activeElement;
            var focusedId = focused && focused.id && region.contains(focused) ? focused.id : null;
            // So does a disclosure the operator opened (the placement's history).
            var opened = Array.prototype.map.call(region.querySelectorAll("details"), function (d) { return d.open; });
            region.innerHTML = replacement.innerHTML;
            Array.prototype.forEach.call(region.querySelectorAll("details"), function (d, index) {
              if (opened[index]) d.open = true;
            });
            var again = focusedId && document.getElementById(focusedId);
            if (again) again.focus();
          });
          var streaming = document.getElementById("streaming-reply");
          if (streaming && body.dataset.streamingRun === "") streaming.hidden = true;
        })
        .catch(function () {});
    }, 150);
  }

  function clearStreaming() {
    var streaming = document.getElementById("streaming-reply");
    if (!streaming) return;
    streaming.querySelector(".text").textContent = "";
    streaming.hidden = true;
  }

  function showDelta(payload) {
    var streaming = document.getElementById("streaming-reply");
    if (!streaming) return;
    var parts = (payload.message && payload.message.content) || [];
    var text = parts.map(function (part) { return part.type === "text" ? part.text : ""; }).join("");
    streaming.querySelector(".text").textContent = text;
    streaming.hidden = false;
    // The first delta of a turn the page has not seen start: its status line and stop button come
    // with one refresh, so the page does not read "idle" while a reply streams in.
    if (body.dataset.streamingRun !== payload.runId) refreshRegions();
    body.dataset.streamingRun = payload.runId;
  }

  function onEvent(frame) {
    var payload = frame.payload || {};
    if (frame.event === "chat") {
      if (payload.sessionKey !== sessionKey) return;
      if (payload.state === "delta") {
        showDelta(payload);
      } else {
        body.dataset.streamingRun = "";
        refreshRegions();
      }
    } else if (frame.event === "agent") {
      if (payload.sessionKey !== sessionKey || payload.stream !== "tool") return;
      // A tool call starts a new step: the text streamed so far is in the transcript now (its assistant
      // message), and the next step's text must not run on from it.
      if (payload.data && payload.data.phase === "start") clearStreaming();
      refreshRegions();
    } else if (frame.event === "sessions.changed") {
      if (!sessionKey || payload.sessionKey === sessionKey) refreshRegions();
    } else if (liveEvents.indexOf(frame.event) !== -1 || APPROVAL_EVENTS.indexOf(frame.event) !== -1) {
      refreshRegions();
    }
  }

  var backoffMs = 500;
  var opened = false;
  function connect() {
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    var query = "?topics=" + encodeURIComponent(topics.join(","));
    var socket = new WebSocket(scheme + window.location.host + "/ui/live/" + query);
    socket.onopen = function () {
      // What happened before the socket opened (a turn that ended meanwhile) comes with one refresh.
      if (opened || body.dataset.running === "true") refreshRegions();
      opened = true;
      backoffMs = 500;
    };
    socket.onmessage = function (message) {
      try { onEvent(JSON.parse(message.data)); } catch (error) { /* a frame we do not understand */ }
    };
    socket.onclose = function () {
      // Reconnect after a restart of the gateway; what changed meanwhile comes with the refresh on open.
      setTimeout(connect, backoffMs);
      backoffMs = Math.min(backoffMs * 2, 10000);
    };
  }
  connect();
})();
