// Live updates for the console's pages: the server pushes session events over /ui/live/; the page
// swaps in the parts that changed (fetched once per event burst, never on a timer).
// Copy buttons of shortened ids and code blocks (``data-copy``: the text, or ``data-copy-from``: the id of the
// element whose text to copy). They are hidden until this script runs: without it there is nothing to press.
(function () {
  "use strict";
  var COPY_BUTTONS = "[data-copy],[data-copy-from]";
  function reveal(root) {
    if (root.matches && root.matches(COPY_BUTTONS)) root.hidden = false;
    Array.prototype.forEach.call(root.querySelectorAll(COPY_BUTTONS), function (button) {
      button.hidden = false;
    });
  }
  reveal(document);
  new MutationObserver(function (changes) {
    changes.forEach(function (change) {
      Array.prototype.forEach.call(change.addedNodes, function (node) { if (node.querySelectorAll) reveal(node); });
    });
  }).observe(document.body, { childList: true, subtree: true });
  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest(COPY_BUTTONS) : null;
    if (!button) return;
    var source = button.dataset.copyFrom ? document.getElementById(button.dataset.copyFrom) : null;
    var text = source ? source.textContent : button.dataset.copy;
    var label = button.textContent;
    function done(word) {
      button.textContent = word;
      setTimeout(function () { button.textContent = label; }, 1500);
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { done("Copied"); }, function () { done("Copy failed"); });
    } else {
      done("Copy failed");
    }
  });
})();


// The session page's composer, title and reply: a message is posted with fetch (the form's own fields, CSRF
// token and idempotency key; the view answers JSON), shows at once, and its reply streams in place; Stop and
// the rename post their forms the same way. Without this script the same forms post and redirect.
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
  var JSON_HEADERS = { Accept: "application/json", "X-Requested-With": "console" };

  function byId(id) { return document.getElementById(id); }
  function activeRunsOf(root) { return (root.body.dataset.activeRuns || "").split(" ").filter(Boolean); }

  // --- following the newest message ---------------------------------------------------------------
  var newest = byId("newest");
  var dock = byId("composer-dock");
  var jump = byId("jump-newest");
  function newestInView() {
    if (!newest) return false;
    var top = newest.getBoundingClientRect().top;
    var dockHeight = dock ? dock.offsetHeight : 0;
    // Within a few lines above the docked composer: the operator is reading the newest message.
    return top >= 0 && top <= window.innerHeight - dockHeight + 64;
  }
  function scrollToNewest() {
    if (!newest) return;
    newest.style.scrollMarginBottom = (dock ? dock.offsetHeight : 0) + 8 + "px";
    newest.scrollIntoView({ block: "end" });
    if (jump) jump.hidden = true;
  }
  // ``change`` adds to the page; the view follows it unless the operator had scrolled away to read.
  function followingChange(change) {
    var following = newestInView();
    change();
    if (following) scrollToNewest();
    else if (jump && newest && !newestInView()) jump.hidden = false;
  }
  if (jump) {
    jump.addEventListener("click", scrollToNewest);
    window.addEventListener("scroll", function () { if (!jump.hidden && newestInView()) jump.hidden = true; }, { passive: true });
  }

  // --- the reply ----------------------------------------------------------------------------------
  var replyState = byId("reply-state");
  var replyingRun = "";
  var replyingSince = 0;
  // Runs whose end event arrived: their stored state must say so before the page stops asking.
  var endedRuns = {};
  function say(text) { if (replyState) replyState.textContent = text; }
  function startReplying(runId, sinceFetch) {
    if (endedRuns[runId]) return;
    replyingRun = runId;
    replyingSince = sinceFetch;
    body.dataset.streamingRun = runId;
    var streaming = byId("streaming-reply");
    if (streaming) streaming.hidden = false;
    say("Replying…");
  }
  function stopReplying(runId, words) {
    if (replyingRun && replyingRun !== runId) return;
    replyingRun = "";
    body.dataset.streamingRun = "";
    say(words);
  }
  function clearStreaming() {
    var streaming = byId("streaming-reply");
    if (!streaming) return;
    streaming.querySelector(".text").textContent = "";
    streaming.hidden = true;
  }

  // --- swapping in the parts that changed ----------------------------------------------------------
  var refreshTimer = null;
  var fetchesStarted = 0;
  var newestApplied = 0;
  var settleAttempts = 0;
  var SETTLE_DELAYS_MS = [250, 500, 1000, 2000, 4000, 8000];

  function refreshRegions(delayMs) {
    // Several events in a burst (a turn's end, its session change) cost one fetch.
    if (refreshTimer) return;
    refreshTimer = setTimeout(function () {
      refreshTimer = null;
      fetchPage();
    }, delayMs === undefined ? 150 : delayMs);
  }

  function editingTitle(region) {
    var form = region.querySelector("#rename-form");
    return Boolean(form && !form.hidden);
  }

  // A region's markup without its forms' CSRF tokens, which Django masks anew at every render: what is compared.
  // A disclosure the operator opened is no change either.
  var CSRF_VALUE = /(name="csrfmiddlewaretoken" value=")[^"]*"/g;
  var OPENED = /(<details[^>]*?) open=""/g;
  function markupOf(region) {
    return region.innerHTML.replace(CSRF_VALUE, '$1"').replace(OPENED, "$1");
  }

  // Each disclosure by its summary's text and how many before it read the same ("Thinking#2"): a key that stays
  // the same when a new tool result or message is drawn before it.
  function disclosureKeys(region) {
    var seen = {};
    return Array.prototype.map.call(region.querySelectorAll("details"), function (d) {
      var summary = d.querySelector("summary");
      var text = summary ? summary.textContent.replace(/\s+/g, " ").trim() : "";
      seen[text] = (seen[text] || 0) + 1;
      return text + "#" + seen[text];
    });
  }

  function swapRegions(fresh) {
    liveRegions.forEach(function (region) {
      var replacement = fresh.querySelector('[data-live-region="' + region.dataset.liveRegion + '"]');
      // Unchanged text is left alone (a screen reader would announce it again); a title being renamed too.
      if (!replacement || markupOf(region) === markupOf(replacement) || editingTitle(region)) return;
      // A keyboard user's focus stays on the same control when its part is swapped in anew.
      var focused = document.activeElement;
      var focusedId = focused && focused.id && region.contains(focused) ? focused.id : null;
      // So does a disclosure the operator opened (the placement's history, a tool's output).
      var disclosures = region.querySelectorAll("details");
      var opened = disclosureKeys(region).filter(function (key, index) { return disclosures[index].open; });
      // And the sessions the operator ticked for a bulk action (by value: rows may move).
      var ticked = Array.prototype.filter.call(region.querySelectorAll("input[type=checkbox]"), function (box) {
        return box.checked;
      }).map(function (box) { return box.name + "=" + box.value; });
      region.innerHTML = replacement.innerHTML;
      Array.prototype.forEach.call(region.querySelectorAll("input[type=checkbox]"), function (box) {
        if (ticked.indexOf(box.name + "=" + box.value) !== -1) box.checked = true;
      });
      var freshKeys = disclosureKeys(region);
      Array.prototype.forEach.call(region.querySelectorAll("details"), function (d, index) {
        if (opened.indexOf(freshKeys[index]) !== -1) d.open = true;
      });
      if (region.dataset.liveRegion === "title") {
        document.title = fresh.title;
        prepareRename();
      }
      var again = focusedId && byId(focusedId);
      if (again) again.focus();
    });
  }

  function fetchPage() {
    var number = ++fetchesStarted;
    fetch(window.location.href, { credentials: "same-origin", headers: { "X-Requested-With": "console" } })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        // An answer slower than a later one is older than what the page shows: it would put back a running
        // turn that has ended (the first page of a process renders slowly, and its turn's end overtook it).
        if (!html || number < newestApplied) return;
        newestApplied = number;
        var fresh = new DOMParser().parseFromString(html, "text/html");
        var active = activeRunsOf(fresh);
        followingChange(function () {
          swapRegions(fresh);
          settlePending(active, number);
        });
        body.dataset.activeRuns = active.join(" ");
        body.dataset.running = active.length ? "true" : "false";
        if (replyingRun && number > replyingSince && active.indexOf(replyingRun) === -1) {
          // The stored run has ended, whatever event this page missed.
          stopReplying(replyingRun, "");
        }
        if (!replyingRun) clearStreaming();
        settleEnded(active);
      })
      .catch(function () {});
  }

  // A turn's end arrived, but the page read its run as still queued or running: ask again, a few times with
  // growing pauses, until the stored state is the end too.
  function settleEnded(active) {
    var unsettled = Object.keys(endedRuns).filter(function (runId) { return active.indexOf(runId) !== -1; });
    Object.keys(endedRuns).forEach(function (runId) { if (unsettled.indexOf(runId) === -1) delete endedRuns[runId]; });
    if (unsettled.length === 0) { settleAttempts = 0; return; }
    if (settleAttempts >= SETTLE_DELAYS_MS.length) { settleAttempts = 0; endedRuns = {}; return; }
    refreshRegions(SETTLE_DELAYS_MS[settleAttempts]);
    settleAttempts += 1;
  }

  function showDelta(payload) {
    var streaming = byId("streaming-reply");
    if (!streaming) return;
    var parts = (payload.message && payload.message.content) || [];
    var text = parts.map(function (part) { return part.type === "text" ? part.text : ""; }).join("");
    // The first delta of a turn the page has not seen start: its status line and stop button come
    // with one refresh, so the page does not read "idle" while a reply streams in.
    if (replyingRun !== payload.runId) {
      startReplying(payload.runId, fetchesStarted);
      refreshRegions();
    }
    followingChange(function () {
      streaming.querySelector(".text").textContent = text;
      streaming.hidden = false;
    });
  }

  var END_WORDS = { final: "Reply finished.", aborted: "Stopped: the turn was aborted." };
  function onEvent(frame) {
    var payload = frame.payload || {};
    if (frame.event === "chat") {
      if (payload.sessionKey !== sessionKey) return;
      if (payload.state === "delta") {
        showDelta(payload);
      } else {
        endedRuns[payload.runId] = true;
        settleAttempts = 0;
        var words = END_WORDS[payload.state] || "The turn failed: " + (payload.errorMessage || "no reason given") + ".";
        stopReplying(payload.runId, words);
        refreshRegions();
      }
    } else if (frame.event === "agent") {
      if (payload.sessionKey !== sessionKey || payload.stream !== "tool") return;
      // A tool call starts a new step: the text streamed so far is in the transcript now (its assistant
      // message), and the next step's text must not run on from it.
      // The composer still says "Replying…" while the tool runs.
      if (payload.data && payload.data.phase === "start") clearStreaming();
      refreshRegions();
    } else if (frame.event === "sessions.changed") {
      if (!sessionKey || payload.sessionKey === sessionKey) refreshRegions();
    } else if (liveEvents.indexOf(frame.event) !== -1 || APPROVAL_EVENTS.indexOf(frame.event) !== -1) {
      refreshRegions();
    }
  }

  // --- posting a form with fetch ------------------------------------------------------------------
  // The form's fields as they are now (read before the caller changes them); the answer is the view's JSON, or
  // a refusal saying why there is none.
  function postForm(form) {
    return fetch(form.action, {
      method: "POST", body: new FormData(form), credentials: "same-origin", headers: JSON_HEADERS
    }).then(function (response) {
      return response.json().catch(function () {
        return { ok: false, error: "the console answered HTTP " + response.status + ": reload the page and try again." };
      });
    }, function () {
      return { ok: false, error: "the gateway could not be reached (the network is down or the gateway is restarting): try again." };
    });
  }

  // --- the composer ---------------------------------------------------------------------------------
  var composer = byId("composer");
  var pendingTurn = byId("pending-turn");
  function userMessageCount() {
    var transcript = document.querySelector('[data-live-region="transcript"]');
    return transcript ? transcript.querySelectorAll("article.role-user").length : 0;
  }
  function addPending(text) {
    var article = document.createElement("article");
    article.className = "message role-user pending";
    article.dataset.userCount = String(userMessageCount());
    var head = document.createElement("h3");
    head.className = "role";
    head.textContent = "user (sending…)";
    var paragraph = document.createElement("p");
    paragraph.className = "text";
    paragraph.textContent = text;
    article.appendChild(head);
    article.appendChild(paragraph);
    pendingTurn.appendChild(article);
    return article;
  }
  // The operator's message leaves the pending place once the transcript holds it: one more user message
  // there, or its run ended (stored) when the transcript shows no more than the newest 200.
  function settlePending(active, fetchNumber) {
    if (!pendingTurn) return;
    var count = userMessageCount();
    Array.prototype.forEach.call(pendingTurn.querySelectorAll("article"), function (article) {
      var runId = article.dataset.runId;
      if (!runId) return;
      var ended = fetchNumber > Number(article.dataset.sentAt) && active.indexOf(runId) === -1;
      if (count > Number(article.dataset.userCount) || ended) article.remove();
    });
  }

  if (composer && pendingTurn) {
    var field = composer.querySelector("textarea");
    var sendButton = composer.querySelector('button[type="submit"]');
    var composerError = byId("composer-error");
    var hint = byId("composer-hint");
    if (hint) hint.hidden = false;
    var sending = false;
    function showComposerError(text) {
      composerError.textContent = text ? "Not sent: " + text : "";
      composerError.hidden = !text;
    }
    field.addEventListener("keydown", function (event) {
      // Enter sends; Shift+Enter is a new line; Enter that ends an IME composition only confirms the text.
      if (event.key !== "Enter" || event.shiftKey || event.isComposing || event.keyCode === 229) return;
      event.preventDefault();
      if (composer.requestSubmit) composer.requestSubmit(); else sendButton.click();
    });
    composer.addEventListener("submit", function (event) {
      event.preventDefault();
      if (sending) return;
      var text = field.value;
      sending = true;
      sendButton.disabled = true;
      showComposerError("");
      var answered = postForm(composer);
      var pending;
      followingChange(function () { pending = addPending(text); });
      field.value = "";
      answered
        .then(function (answer) {
          if (!answer.ok) {
            // Nothing was submitted (or nothing the page knows of): the text goes back, the same idempotency key
            // stays, so sending it again after a lost answer is still one turn.
            pending.remove();
            field.value = field.value ? text + "\n" + field.value : text;
            showComposerError(answer.error);
            field.focus();
            return;
          }
          composer.elements.idempotencyKey.value = answer.nextIdempotencyKey;
          pending.dataset.runId = answer.runId;
          pending.dataset.sentAt = String(fetchesStarted);
          pending.querySelector(".role").textContent = "user";
          startReplying(answer.runId, fetchesStarted);
          refreshRegions(0);
        })
        .then(function () {
          sending = false;
          sendButton.disabled = false;
        });
    });
  }

  // --- stop ---------------------------------------------------------------------------------------
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form.id !== "abort-form") return;
    event.preventDefault();
    var button = form.querySelector("button");
    button.disabled = true;
    postForm(form).then(function (answer) {
      button.disabled = false;
      if (answer.ok) say(answer.message);
      else say("Not stopped: " + answer.error);
      refreshRegions(0);
    });
  });

  // --- renaming in place --------------------------------------------------------------------------
  function prepareRename() {
    var start = byId("rename-start");
    if (start) start.hidden = false;
  }
  function renameParts() {
    return { title: byId("session-title"), start: byId("rename-start"), form: byId("rename-form"), error: byId("rename-error") };
  }
  function openRename() {
    var parts = renameParts();
    if (!parts.form) return;
    parts.title.hidden = true;
    parts.start.hidden = true;
    parts.form.hidden = false;
    var input = parts.form.elements.label;
    input.focus();
    input.select();
  }
  function closeRename() {
    var parts = renameParts();
    if (!parts.form) return;
    parts.form.elements.label.value = parts.form.elements.label.defaultValue;
    parts.error.hidden = true;
    parts.form.hidden = true;
    parts.title.hidden = false;
    parts.start.hidden = false;
    parts.start.focus();
  }
  document.addEventListener("click", function (event) {
    var target = event.target;
    if (!target.closest) return;
    if (target.closest("[data-rename-start]") || target.closest("[data-rename-title]")) openRename();
    else if (target.closest("[data-rename-cancel]")) closeRename();
  });
  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape" && event.target.id === "rename-label") closeRename();
  });
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form.id !== "rename-form") return;
    event.preventDefault();
    var parts = renameParts();
    var posted = form.elements.revision ? form.elements.revision.value : null;
    postForm(form).then(function (answer) {
      if (!answer.ok) {
        parts.error.textContent = answer.error;
        parts.error.hidden = false;
        return;
      }
      parts.title.textContent = answer.title;
      document.title = answer.title + " · OpenClaw console";
      form.elements.label.defaultValue = answer.label;
      // The operator saw this change (their own): a form that showed the revision the rename was made on now sends
      // the rename's. A form drawn before some other change keeps its older revision, so the server still refuses
      // it as stale (the reset, archive and delete forms carry the revision their card showed).
      Array.prototype.forEach.call(document.querySelectorAll('input[name="revision"]'), function (input) {
        if (posted === null || input.value !== posted) return;
        input.value = String(answer.revision);
        input.defaultValue = String(answer.revision);
      });
      var cardLabel = byId("settings-label");
      var cardRevision = byId("settings-revision");
      var cardInput = byId("session-label");
      if (cardLabel) cardLabel.textContent = answer.label || "—";
      if (cardRevision && cardRevision.textContent === posted) cardRevision.textContent = String(answer.revision);
      if (cardInput) { cardInput.value = answer.label; cardInput.defaultValue = answer.label; }
      closeRename();
      say("Renamed.");
    });
  });
  prepareRename();

  // At a page's opening, its newest message shows (unless the page opens on a notice at its top).
  if (newest && !document.querySelector(".messages") && !window.location.hash && userMessageCount() > 0) {
    scrollToNewest();
  }

  // --- the live socket ------------------------------------------------------------------------------
  if (topics.length === 0) return;
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
