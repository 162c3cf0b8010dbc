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
