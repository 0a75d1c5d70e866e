// fairlane console: draws the usage charts (Chart.js) from the JSON the page carries, after the
// first load and after every htmx swap. No inline scripts: the console's CSP allows only these files.
(function () {
  "use strict";
  var COLORS = ["#2563eb", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d", "#92400e", "#6b7280"];
  var charts = {};
  window.fairlaneCharts = charts; // read by the browser tests

  function bar(canvas, labels, datasets, stacked) {
    return new Chart(canvas, {
      type: "bar",
      data: { labels: labels, datasets: datasets },
      options: {
        animation: false,
        responsive: true,
        maintainAspectRatio: false,
        scales: { x: { stacked: stacked }, y: { stacked: stacked, beginAtZero: true } },
        plugins: { legend: { position: "bottom" } },
      },
    });
  }

  function draw() {
    var holder = document.getElementById("usage-data");
    Object.keys(charts).forEach(function (name) {
      charts[name].destroy();
      delete charts[name];
    });
    if (!holder || typeof Chart === "undefined") return;
    var data = JSON.parse(holder.textContent);
    var perOwner = function (field) {
      return data.series.map(function (s, i) {
        return { label: s.label, data: s[field], backgroundColor: COLORS[i % COLORS.length] };
      });
    };
    var problems = [
      { label: "errors", data: data.problems.errors, backgroundColor: "#dc2626" },
      { label: "SLO refusals", data: data.problems.slo_refusals, backgroundColor: "#d97706" },
      { label: "429s (quota)", data: data.problems.rate_limited, backgroundColor: "#7c3aed" },
    ];
    charts.tokens = bar(document.getElementById("chart-tokens"), data.labels, perOwner("tokens"), true);
    charts.requests = bar(document.getElementById("chart-requests"), data.labels, perOwner("requests"), true);
    charts.problems = bar(document.getElementById("chart-problems"), data.labels, problems, false);
  }

  // htmx swaps no 4xx or 5xx answer: without this, a refused change (a CSRF token replaced by a
  // sign-in in another tab, an error of the gateway) would show nothing at all.
  function showError(text) {
    var main = document.getElementById("main");
    if (!main) return;
    var notice = document.getElementById("request-error");
    if (!notice) {
      notice = document.createElement("p");
      notice.id = "request-error";
      notice.className = "error";
      notice.setAttribute("role", "alert");
    }
    main.insertBefore(notice, main.firstChild);
    notice.textContent = text; // text, never HTML
    notice.scrollIntoView({ block: "nearest" });
  }

  function errorText(xhr) {
    var text = (xhr.responseText || "").trim();
    try {
      var body = JSON.parse(text);
      if (body && body.error && body.error.message) text = body.error.message;
    } catch (e) {}
    return (text.slice(0, 500) || "The request failed.") + " (HTTP " + xhr.status + ")";
  }

  document.addEventListener("DOMContentLoaded", function () {
    draw();
    document.body.addEventListener("htmx:responseError", function (event) {
      showError(errorText(event.detail.xhr));
    });
    document.body.addEventListener("htmx:sendError", function () {
      showError("The gateway did not answer: is it running?");
    });
    document.body.addEventListener("htmx:afterSettle", function (event) {
      if (event.detail.elt && event.detail.elt.id !== "live") draw();
    });
  });
})();
