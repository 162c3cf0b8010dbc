// Live numbers: an element with data-live="URL" listens to server-sent events from URL; each
// event is JSON {field: value}; elements inside with data-field="field" get the new text,
// data-html-field="field" the new (server-rendered, escaped) markup. No framework, no build.
(function () {
  document.querySelectorAll("[data-live]").forEach(function (box) {
    if (!window.EventSource) return;
    var source = new EventSource(box.getAttribute("data-live"));
    source.onmessage = function (event) {
      var data = JSON.parse(event.data);
      Object.keys(data).forEach(function (key) {
        document.querySelectorAll('[data-field="' + CSS.escape(key) + '"]').forEach(function (el) {
          var text = String(data[key]);
          if (el.textContent !== text) {
            el.textContent = text;
            el.classList.remove("flash"); void el.offsetWidth; el.classList.add("flash");
          }
        });
        document.querySelectorAll('[data-html-field="' + CSS.escape(key) + '"]').forEach(function (el) {
          el.innerHTML = data[key];
        });
      });
      document.body.setAttribute("data-live-updates", String(Number(document.body.getAttribute("data-live-updates") || 0) + 1));
    };
    source.addEventListener("done", function () { source.close(); });
  });
})();

// The compare form of the runs list: once a first run is checked (the baseline), only runs that
// share sample ids with it can be checked; the others are disabled with the reason beside them.
// The form says which baseline it offers for in data-sharing-for (empty: no filter).
(function () {
  var form = document.getElementById("compare-form");
  if (!form || !window.fetch) return;
  var boxes = Array.prototype.slice.call(form.querySelectorAll('input[type=checkbox][name=run]'));
  var base = form.querySelector('input[name=base]');
  var order = [];  // the checked runs, in the order they were checked
  function apply(baseline, sharing) {
    boxes.forEach(function (box) {
      var off = baseline !== "" && box.value !== baseline && sharing.indexOf(box.value) < 0;
      box.disabled = off;
      if (off) box.checked = false;
      box.title = off ? "shares no sample ids with the baseline: not on the same dataset" : "";
      var why = box.parentNode.querySelector(".why");
      if (why) why.textContent = off ? " no shared samples" : "";
    });
    order = order.filter(function (id) { return boxes.some(function (b) { return b.value === id && b.checked; }); });
    form.setAttribute("data-sharing-for", baseline);
  }
  function offer() {
    var baseline = order.length ? order[0] : "";
    if (base) base.value = baseline;
    if (baseline === "") { apply("", []); return; }
    var box = boxes.filter(function (b) { return b.value === baseline; })[0];
    fetch(box.getAttribute("data-sharing"), {credentials: "same-origin"})
      .then(function (r) { return r.json(); })
      .then(function (data) { if (order[0] === baseline) apply(baseline, data.sharing || []); });
  }
  form.addEventListener("change", function (event) {
    var box = event.target;
    if (box.name !== "run") return;
    var was = order.length ? order[0] : "";
    if (box.checked) order.push(box.value);
    else order = order.filter(function (id) { return id !== box.value; });
    if ((order.length ? order[0] : "") !== was) offer();
  });
})();
