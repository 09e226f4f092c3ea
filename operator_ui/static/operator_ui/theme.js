// The console's colour theme: "auto" follows the system (prefers-color-scheme), "light" or "dark" is the operator's
// choice, remembered in this browser (localStorage). Loaded without `defer` in <head> so the chosen theme is on
// <html data-theme> before the first paint (no flash of the other theme); the header's chooser is wired once the
// page is parsed. Without JavaScript the chooser stays hidden and the system's theme applies.
(function () {
  "use strict";
  var KEY = "openclaw-console-theme";
  var CHOICES = ["auto", "light", "dark"];
  var root = document.documentElement;

  function stored() {
    try {
      var value = window.localStorage.getItem(KEY);
      return CHOICES.indexOf(value) === -1 ? "auto" : value;
    } catch (error) {
      return "auto"; // storage refused (private mode, a policy): the system's theme
    }
  }

  function apply(choice) {
    if (choice === "auto") root.removeAttribute("data-theme");
    else root.setAttribute("data-theme", choice);
  }

  apply(stored());

  document.addEventListener("DOMContentLoaded", function () {
    var chooser = document.getElementById("theme-choice");
    if (!chooser) return;
    var select = chooser.querySelector("select");
    select.value = stored();
    chooser.hidden = false;
    select.addEventListener("change", function () {
      var choice = CHOICES.indexOf(select.value) === -1 ? "auto" : select.value;
      try {
        if (choice === "auto") window.localStorage.removeItem(KEY);
        else window.localStorage.setItem(KEY, choice);
      } catch (error) { /* not remembered; still applied to this page */ }
      apply(choice);
    });
  });
})();
