// The MOP results pages: plain DOM and inline SVG drawn from the run's JSON (no library, no network
// beyond this API server). Every text from the run goes in as text, never as HTML.
(function () {
  "use strict";

  var REFRESH_MS = 5000;
  var SVG_NS = "http://www.w3.org/2000/svg";
  var PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#7f7f7f", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#bcbd22", "#393b79", "#637939"];
  var context = JSON.parse(document.getElementById("context").textContent);
  var enc = encodeURIComponent;

  function el(tag, attrs) {
    var node = document.createElement(tag);
    setAttrs(node, attrs);
    appendAll(node, Array.prototype.slice.call(arguments, 2));
    return node;
  }

  function svg(tag, attrs) {
    var node = document.createElementNS(SVG_NS, tag);
    setAttrs(node, attrs);
    appendAll(node, Array.prototype.slice.call(arguments, 2));
    return node;
  }

  function setAttrs(node, attrs) {
    Object.keys(attrs || {}).forEach(function (key) {
      var value = attrs[key];
      if (value === null || value === undefined) return;
      if (key === "text") node.textContent = String(value);
      else node.setAttribute(key, String(value));
    });
  }

  function appendAll(node, children) {
    children.forEach(function (child) {
      if (child === null || child === undefined) return;
      if (Array.isArray(child)) appendAll(node, child);
      else node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    });
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
    return node;
  }

  function num(value, digits) {
    if (typeof value !== "number" || !isFinite(value)) return "\u2013";
    if (Number.isInteger(value)) return String(value);
    return value.toPrecision(digits || 4).replace(/(\.\d*?)0+$/, "$1").replace(/\.$/, "");
  }

  function pct(value) {
    return typeof value === "number" && isFinite(value) ? (100 * value).toFixed(1) + "%" : "\u2013";
  }

  function builder(path) {
    return String(path).split(":").pop();
  }

  function hparamText(config) {
    var parts = [builder(config.model), config.optimizer, "lr " + num(config.learning_rate, 3),
      "batch " + config.batch_size];
    Object.keys(config.hparams || {}).sort().forEach(function (key) {
      var value = config.hparams[key];
      parts.push(key + "=" + (typeof value === "object" ? JSON.stringify(value) : String(value)));
    });
    return parts.join(" \u00b7 ");
  }

  function showMessage(text) {
    var node = document.getElementById("message");
    node.textContent = text;
    node.hidden = !text;
  }

  // ---------------------------------------------------------------- the list of runs
  function loadRuns() {
    fetch("api/runs", {credentials: "same-origin", cache: "no-store"}).then(function (response) {
      return response.json().then(function (body) { return {ok: response.ok, status: response.status, body: body}; });
    }).then(function (result) {
      if (!result.ok) { showMessage(result.status + ": " + (result.body.detail || "not allowed")); return; }
      var tbody = clear(document.querySelector("#runs tbody"));
      if (!result.body.runs.length) showMessage("No runs of mop_airflow DAGs yet (or none you may read).");
      result.body.runs.forEach(function (run) {
        var href = "runs/" + enc(run.dag_id) + "/" + enc(run.run_id);
        var groups = run.groups || [];
        tbody.appendChild(el("tr", {"data-dag-id": run.dag_id, "data-run-id": run.run_id,
          "data-groups": groups.join(" ")},
          el("td", {text: run.dag_id}),
          el("td", {}, el("a", {href: href, text: run.run_id})),
          // a run of MopTaskGroups: one model selection per group, each with its own results
          el("td", {"class": "groups"}, groups.length ? groups.map(function (group, i) {
            return [i ? ", " : null, el("a", {href: href + "?group=" + enc(group), "data-group": group, text: group})];
          }) : "\u2013"),
          el("td", {}, el("span", {"class": "state state-" + run.run_state, text: run.run_state})),
          el("td", {text: (run.start_date || "").replace("T", " ").slice(0, 19)}),
          el("td", {text: (run.end_date || "").replace("T", " ").slice(0, 19)})));
      });
    }).catch(function (error) { showMessage("Could not reach the API server: " + error); });
  }

  // ---------------------------------------------------------------- one run
  var colors = {};

  function refresh() {
    var url = "../../api/runs/" + enc(context.dag_id) + "/" + enc(context.run_id) + groupQuery(context.group);
    fetch(url, {credentials: "same-origin", cache: "no-store"}).then(function (response) {
      return response.json().catch(function () { return {}; }).then(function (body) {
        return {ok: response.ok, status: response.status, body: body};
      });
    }).then(function (result) {
      if (!result.ok) {
        showMessage(result.status + ": " + (result.body.detail || "the results could not be read"));
        if (result.status >= 500) setTimeout(refresh, REFRESH_MS);
        return;
      }
      var data = result.body;
      context.group = data.group;  // the server's choice when none was asked for: later refreshes keep it
      render(data);
      window.mopStages = (window.mopStages || []).concat([data.stage]);
      document.body.dataset.stage = data.stage;
      document.body.dataset.runState = data.run_state || "";
      document.body.dataset.renders = String((window.mopStages || []).length);
      if (data.run_state !== "success" && data.run_state !== "failed") setTimeout(refresh, REFRESH_MS);
    }).catch(function (error) {
      showMessage("Could not reach the API server: " + error);
      setTimeout(refresh, REFRESH_MS);
    });
  }

  function groupQuery(group) {
    return group ? "?group=" + enc(group) : "";
  }

  // A run of several MopTaskGroups: one link per group's model selection, the shown one marked.
  function renderSelections(data) {
    var nav = clear(document.getElementById("selections"));
    var groups = data.groups || [];
    nav.hidden = groups.length < 2;
    if (nav.hidden) return;
    nav.appendChild(el("span", {"class": "note", text: "Model selections of this run: "}));
    groups.forEach(function (group) {
      var current = group === data.group;
      nav.appendChild(el("a", {href: groupQuery(group), "data-group": group, "class": current ? "current" : null,
        "aria-current": current ? "page" : null, text: group}));
    });
  }

  function render(data) {
    document.getElementById("title").textContent = data.dag_id + " \u00b7 " + data.run_id +
      (data.group ? " \u00b7 group " + data.group : "");
    renderSelections(data);
    var status = clear(document.getElementById("status"));
    status.appendChild(el("span", {"class": "state state-" + data.run_state, text: data.run_state || "unknown"}));
    var main = document.getElementById("results");
    if (data.stage === "waiting" || data.stage === "failed") {
      showMessage(data.message);
      main.hidden = true;
      return;
    }
    showMessage("");
    main.hidden = false;
    (data.configs || []).forEach(function (config, i) { colors[config.config_id] = PALETTE[i % PALETTE.length]; });
    var configs = {};
    data.configs.forEach(function (config) { configs[config.config_id] = config; });
    renderProgress(data);
    renderLeaderboard(data, configs);
    renderLineage(data);
    renderImportance(data);
    renderCurves(data, configs);
    renderTimeline(data, configs);
    renderPlan(data, configs);
    renderDownloads(data);
  }

  function renderProgress(data) {
    var p = data.progress;
    var text = "Model hops " + p.hops_done + " / " + p.hops_total + " \u00b7 iteration " +
      Math.min(Math.max(p.iteration, 0), p.iterations) + " of " + p.iterations;
    if (p.failed) text += " \u00b7 " + p.failed + " configuration(s) failed";
    text += p.best ? " \u00b7 best " + data.metric + " " + num(p.best[data.metric]) + " (" + p.best.config_id + ")"
      : " \u00b7 no validation yet";
    var stages = {resolved: "validating and sharding the data", planned: "planned, waiting for the first hop",
      training: "training", reported: "finished: report written"};
    var stage = data.run_state === "failed" && data.stage !== "reported" ? "the run failed" : stages[data.stage];
    if (data.waiting && data.waiting.length) {  // a lost worker, or none serving the queue: say which and since when
      stage = data.waiting.map(function (w) { return w.line; }).join("; ");
    }
    document.getElementById("progress-text").textContent = text + " \u00b7 " + (stage || data.stage);
    var done = p.hops_total ? p.hops_done / p.hops_total : 0;
    document.getElementById("progress-bar").style.width = (100 * Math.min(1, done)).toFixed(1) + "%";
  }

  function swatch(cid) {
    return el("span", {"class": "swatch", style: "background:" + (colors[cid] || "#999")});
  }

  function renderLeaderboard(data, configs) {
    var board = data.leaderboard;
    var adaptive = !!data.plan.adaptive;
    var metric = data.metric;
    document.getElementById("leaderboard-note").textContent = (board.final
      ? "Final, from the run's report. "
      : data.run_state === "failed" ? "The run failed before its report: ranked on what was evaluated. "
      : "Provisional: ranked on what has been evaluated so far; this page refreshes every " +
        REFRESH_MS / 1000 + " s while the run is going. ") +
      metric + ": " + (data.direction === "min" ? "lower" : "higher") + " is better.";
    var head = ["Rank", "Configuration", "Hyperparameters", metric, "val_loss", "Iteration"];
    if (adaptive) head.push("Bracket");
    head.push("Outcome");
    var thead = clear(document.querySelector("#leaderboard thead"));
    thead.appendChild(el("tr", {}, head.map(function (h) { return el("th", {text: h}); })));
    var tbody = clear(document.querySelector("#leaderboard tbody"));
    board.leaderboard.forEach(function (row) {
      var config = configs[row.config_id] || row;
      var cells = [
        el("td", {"class": "num", text: row.rank}),
        el("td", {"class": "config"}, swatch(row.config_id), row.config_id),
        el("td", {text: hparamText(config)}),
        el("td", {"class": "num metric", text: num(row[metric])}),
        el("td", {"class": "num", text: num(row.val_loss)}),
        el("td", {"class": "num", text: typeof row.iteration === "number" ? row.iteration + 1 : "\u2013"})];
      if (adaptive) cells.push(el("td", {"class": "num", text: row.bracket === null ? "\u2013" : row.bracket}));
      cells.push(el("td", {"class": "outcome status-" + row.status, text: row.outcome || row.status}));
      tbody.appendChild(el("tr", {"data-config-id": row.config_id, "data-status": row.status}, cells));
    });
    // The champion/challenger decision the report task took, and why (mop_airflow.serving.champion).
    var challenge = data.summary && data.summary.challenge;
    var champion = document.getElementById("champion");
    champion.hidden = !challenge;
    champion.textContent = challenge
      ? (challenge.publish ? "Published as the DAG's champion: " : "Not published: ") + challenge.reason : "";
    if (challenge) champion.setAttribute("data-publish", challenge.publish ? "true" : "false");
    var best = clear(document.getElementById("best-per-bracket"));
    var brackets = Object.keys(board.best_per_bracket || {});
    if (brackets.length) {
      best.appendChild(el("h3", {text: "Best per bracket"}));
      best.appendChild(el("table", {id: "best-per-bracket-table"},
        el("thead", {}, el("tr", {}, el("th", {text: "Bracket"}), el("th", {text: "Configuration"}),
          el("th", {text: metric}))),
        el("tbody", {}, brackets.sort().map(function (s) {
          var entry = board.best_per_bracket[s];
          return el("tr", {}, el("td", {"class": "num", text: s}),
            el("td", {"class": "config"}, swatch(entry.config_id), entry.config_id),
            el("td", {"class": "num", text: num(entry[metric])}));
        }))));
    }
  }

  function ticks(lo, hi, count) {
    var span = hi - lo;
    if (!(span > 0)) return [lo];
    var step = Math.pow(10, Math.floor(Math.log10(span / count)));
    var err = span / count / step;
    if (err >= 7.5) step *= 10; else if (err >= 3.5) step *= 5; else if (err >= 1.5) step *= 2;
    var out = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
    return out;
  }

  function renderCurves(data, configs) {
    var holder = clear(document.getElementById("curves"));
    var curves = data.curves;
    var iterations = Math.max(1, data.plan.iterations);
    curves.charts.forEach(function (chart) {
      var W = 460, H = 270, M = {l: 56, r: 14, t: 26, b: 38};
      var values = [];
      Object.keys(curves.configs).forEach(function (cid) {
        curves.configs[cid].points.forEach(function (p) {
          [chart.train, chart.validation].forEach(function (k) { if (typeof p[k] === "number") values.push(p[k]); });
        });
      });
      var root = svg("svg", {id: "curves-" + chart.name, "class": "chart", width: W, height: H,
        viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": chart.name + " per iteration"});
      root.appendChild(svg("text", {x: M.l, y: 16, "class": "chart-title", text: chart.name + " per iteration"}));
      holder.appendChild(root);
      if (!values.length) {
        root.appendChild(svg("text", {x: W / 2, y: H / 2, "text-anchor": "middle", "class": "empty",
          text: "no iteration trained yet"}));
        return;
      }
      var lo = Math.min.apply(null, values), hi = Math.max.apply(null, values);
      var pad = (hi - lo) * 0.08 || Math.abs(hi) * 0.05 || 0.05;
      lo -= pad; hi += pad;
      var x = function (it) { return M.l + (it + 1 - 0.5) / iterations * (W - M.l - M.r); };
      var y = function (v) { return H - M.b - (v - lo) / (hi - lo) * (H - M.t - M.b); };
      var axes = svg("g", {"class": "axes"});
      axes.appendChild(svg("line", {x1: M.l, y1: H - M.b, x2: W - M.r, y2: H - M.b}));
      axes.appendChild(svg("line", {x1: M.l, y1: M.t, x2: M.l, y2: H - M.b}));
      var step = Math.max(1, Math.ceil(iterations / 10));
      for (var it = 0; it < iterations; it += step) {
        axes.appendChild(svg("text", {x: x(it), y: H - M.b + 15, "text-anchor": "middle", text: it + 1}));
      }
      axes.appendChild(svg("text", {x: (W + M.l) / 2, y: H - 6, "text-anchor": "middle", text: "iteration"}));
      ticks(lo, hi, 5).forEach(function (v) {
        axes.appendChild(svg("line", {"class": "grid", x1: M.l, x2: W - M.r, y1: y(v), y2: y(v)}));
        axes.appendChild(svg("text", {x: M.l - 6, y: y(v) + 4, "text-anchor": "end", text: num(v, 3)}));
      });
      root.appendChild(axes);
      Object.keys(curves.configs).forEach(function (cid) {
        var curve = curves.configs[cid];
        var color = colors[cid] || "#999";
        var label = configs[cid] ? configs[cid].label : cid;
        var group = svg("g", {"class": "curve", "data-config-id": cid}, svg("title", {text: label}));
        [["train", chart.train, ""], ["validation", chart.validation, "5 4"]].forEach(function (kind) {
          var pts = curve.points.filter(function (p) { return typeof p[kind[1]] === "number"; });
          if (!pts.length) return;
          group.appendChild(svg("polyline", {"class": "line " + kind[0], stroke: color, fill: "none",
            "stroke-dasharray": kind[2] || null,
            points: pts.map(function (p) { return x(p.iteration) + "," + y(p[kind[1]]); }).join(" ")}));
          pts.forEach(function (p) {
            group.appendChild(svg("circle", {"class": "point " + kind[0], cx: x(p.iteration), cy: y(p[kind[1]]),
              r: kind[0] === "train" ? 3 : 2.5, fill: kind[0] === "train" ? color : "#fff", stroke: color},
              svg("title", {text: cid + " " + kind[0] + " " + kind[1] + " " + num(p[kind[1]]) +
                " at iteration " + (p.iteration + 1) + (p.complete ? "" : " (iteration not complete)")})));
          });
        });
        var stop = curve.stop;
        if (stop && typeof stop.iteration === "number") {
          var at = curve.points.filter(function (p) { return p.iteration === stop.iteration; })[0];
          var value = at ? (typeof at[chart.validation] === "number" ? at[chart.validation] : at[chart.train]) : null;
          var cx = x(stop.iteration), cy = typeof value === "number" ? y(value) : H - M.b - 8;
          group.appendChild(svg("path", {"class": "stop stop-" + stop.status, stroke: color,
            d: "M" + (cx - 5) + "," + (cy - 5) + "L" + (cx + 5) + "," + (cy + 5) + "M" + (cx - 5) + "," + (cy + 5) +
              "L" + (cx + 5) + "," + (cy - 5)}, svg("title", {text: cid + ": " + stop.outcome})));
        }
        root.appendChild(group);
      });
    });
    var legend = clear(document.getElementById("legend"));
    data.configs.forEach(function (config) {
      var curve = curves.configs[config.config_id] || {};
      legend.appendChild(el("span", {"class": "legend-item", "data-config-id": config.config_id},
        swatch(config.config_id), config.config_id + " " + hparamText(config) +
        (curve.stop ? " (" + curve.stop.outcome.split(":")[0] + ")" : "")));
    });
  }

  function renderTimeline(data, configs) {
    var tl = data.timeline;
    var holder = clear(document.getElementById("timeline"));
    var busy = document.getElementById("busy");
    if (!tl.hops.length) {
      busy.textContent = "No hop has finished yet: each shard's row fills with the hops it trained.";
      return;
    }
    busy.textContent = "Shard pools busy " + pct(tl.busy) + " of the " + num(tl.span, 3) +
      " s from the first hop's start to the last hop's save (training " + pct(tl.training) +
      "). A bar is one hop, its dark part the training; grey is a slot left idle.";
    var lanes = Math.max(1, tl.lanes || 1), laneH = 18, gap = 8, L = 150, R = 16, T = 8, B = 34;
    var W = Math.max(600, Math.min(1200, holder.clientWidth || 960));
    var H = T + tl.shards * (lanes * laneH + gap) + B;
    var x = function (s) { return L + s / tl.span * (W - L - R); };
    var rowY = function (shard, lane) { return T + shard * (lanes * laneH + gap) + lane * laneH; };
    var root = svg("svg", {id: "timeline-chart", "class": "chart", width: W, height: H, viewBox: "0 0 " + W + " " + H,
      role: "img", "aria-label": "hop timeline per shard"});
    for (var s = 0; s < tl.shards; s++) {
      root.appendChild(svg("rect", {"class": "idle", x: L, y: rowY(s, 0), width: W - L - R, height: lanes * laneH - 2}));
      root.appendChild(svg("text", {"class": "shard-label", "data-shard": s, x: L - 8, y: rowY(s, 0) + lanes * laneH / 2 + 4,
        "text-anchor": "end", text: "shard " + s + " \u00b7 busy " + pct(tl.busy_by_shard[s])}));
    }
    tl.hops.forEach(function (hop) {
      var color = colors[hop.config_id] || "#999";
      var y0 = rowY(hop.shard, hop.lane);
      var seconds = hop.end - hop.start;
      var title = hop.config_id + " \u00b7 hop t=" + hop.t + " (iteration " + (hop.iteration + 1) + ") on shard " +
        hop.shard + " \u00b7 " + num(hop.start, 3) + "\u2013" + num(hop.end, 3) + " s (" + num(seconds, 3) + " s" +
        (hop.train_begin !== null && hop.train_end !== null ? ", training " + num(hop.train_end - hop.train_begin, 3) + " s" : "") +
        ")" + (hop.host ? " on " + hop.host : "");
      var group = svg("g", {"class": "hop-group", "data-config-id": hop.config_id}, svg("title", {text: title}));
      group.appendChild(svg("rect", {"class": "hop", "data-config-id": hop.config_id, "data-shard": hop.shard,
        "data-t": hop.t, x: x(hop.start), y: y0 + 1, width: Math.max(1, x(hop.end) - x(hop.start)),
        height: laneH - 4, fill: color, "fill-opacity": 0.4, stroke: color}));
      if (hop.train_begin !== null && hop.train_end !== null) {
        group.appendChild(svg("rect", {"class": "training", x: x(hop.train_begin), y: y0 + 4,
          width: Math.max(1, x(hop.train_end) - x(hop.train_begin)), height: laneH - 10, fill: color}));
      }
      root.appendChild(group);
    });
    var axisY = H - B + 4;
    root.appendChild(svg("line", {"class": "axis", x1: L, x2: W - R, y1: axisY, y2: axisY}));
    ticks(0, tl.span, 8).forEach(function (v) {
      root.appendChild(svg("text", {"class": "tick", x: x(v), y: axisY + 14, "text-anchor": "middle", text: num(v, 3)}));
    });
    root.appendChild(svg("text", {"class": "tick", x: (W + L) / 2, y: axisY + 28, "text-anchor": "middle",
      text: "seconds since the first hop started"}));
    holder.appendChild(root);
  }

  function valueText(value) {
    return typeof value === "number" ? num(value, 3) : String(value);
  }

  function renderLineage(data) {
    var lineage = data.lineage;
    var section = document.getElementById("lineage-section");
    var holder = clear(document.getElementById("lineage"));
    section.hidden = !lineage;
    if (!lineage) return;
    var L = 70, R = 20, T = 10, rowH = 34, W = 900;
    var H = T + lineage.members * rowH + 30;
    var span = Math.max(1, lineage.iterations || 1);
    var x = function (it) { return L + (W - L - R) * it / span; };
    var y = function (m) { return T + m * rowH + rowH / 2; };
    var root = svg("svg", {width: W, height: H, viewBox: "0 0 " + W + " " + H, "class": "lineage"});
    for (var m = 0; m < lineage.members; m++) {
      root.appendChild(svg("text", {"class": "tick", x: L - 8, y: y(m) + 4, "text-anchor": "end", text: "member " + m}));
    }
    lineage.segments.forEach(function (seg) {
      var label = seg.config_id + " " + lineage.fields.map(function (f) {
        return f + "=" + valueText(seg.values[f]);
      }).join(" ");
      var bar = svg("rect", {"class": "segment", "data-config-id": seg.config_id, "data-member": seg.member,
        x: x(seg.from) + 1, y: y(seg.member) - 9, width: Math.max(2, x(seg.to) - x(seg.from) - 2), height: 18,
        fill: colors[seg.config_id] || "#999"});
      bar.appendChild(svg("title", {text: label + " (iterations " + (seg.from + 1) + " to " + seg.to + ")"}));
      root.appendChild(bar);
      root.appendChild(svg("text", {"class": "segment-label", x: x(seg.from) + 4, y: y(seg.member) + 4, text: label}));
    });
    var member = {};
    lineage.segments.forEach(function (seg) { (member[seg.config_id] = member[seg.config_id] || []).push(seg); });
    lineage.copies.forEach(function (c) {
      var from = (member[c.parent] || [{member: c.member}])[0].member;
      var link = svg("line", {"class": "copy", "data-config-id": c.config_id, "data-parent": c.parent,
        x1: x(c.iteration), y1: y(from), x2: x(c.iteration) + 8, y2: y(c.member)});
      link.appendChild(svg("title", {text: c.config_id + " copied " + c.parent + " (" + num(c.parent_metric, 4) +
        ") after iteration " + c.iteration + ", replacing " + c.replaced + " (" + num(c.replaced_metric, 4) + "): " +
        Object.keys(c.changes).map(function (k) { return k + " " + valueText(c.changes[k][0]) + " \u2192 " +
          valueText(c.changes[k][1]); }).join(", ")}));
      root.appendChild(link);
    });
    for (var it = 0; it <= span; it++) {
      root.appendChild(svg("text", {"class": "tick", x: x(it), y: H - 8, "text-anchor": "middle", text: it}));
    }
    holder.appendChild(root);
    holder.appendChild(el("table", {id: "copies"},
      el("thead", {}, el("tr", {}, ["After iteration", "Member", "Replaced", "By a copy of", "As", "Changes"]
        .map(function (h) { return el("th", {text: h}); }))),
      el("tbody", {}, lineage.copies.map(function (c) {
        return el("tr", {"data-config-id": c.config_id},
          el("td", {"class": "num", text: c.iteration}), el("td", {"class": "num", text: c.member}),
          el("td", {"class": "config", text: c.replaced + " (" + num(c.replaced_metric, 4) + ")"}),
          el("td", {"class": "config", text: c.parent + " (" + num(c.parent_metric, 4) + ")"}),
          el("td", {"class": "config"}, swatch(c.config_id), c.config_id),
          el("td", {text: Object.keys(c.changes).map(function (k) {
            return k + " " + valueText(c.changes[k][0]) + " \u2192 " + valueText(c.changes[k][1]); }).join(", ")}));
      }))));
  }

  function renderImportance(data) {
    var found = (data.leaderboard || {}).importance;
    var section = document.getElementById("importance-section");
    section.hidden = !found;
    if (!found) return;
    var note = document.getElementById("importance-note");
    var table = document.getElementById("importance");
    clear(table.tHead); clear(table.tBodies[0]);
    if (found.error) {
      note.textContent = "Not measured: " + found.error;
      return;
    }
    note.textContent = found.evaluator + " importance of each searched hyperparameter for " + found.metric +
      ", over the " + found.trials + " configurations that finished (the shares add up to 1).";
    table.tHead.appendChild(el("tr", {}, ["Hyperparameter", "Importance", ""].map(function (h) {
      return el("th", {text: h}); })));
    found.importances.forEach(function (row) {
      table.tBodies[0].appendChild(el("tr", {"data-field": row.field}, el("td", {text: row.field}),
        el("td", {"class": "num", text: num(row.importance, 3)}),
        el("td", {}, el("div", {"class": "share", style: "width:" + (200 * row.importance).toFixed(0) + "px"}))));
    });
  }

  function adaptiveText(a) {
    if (a.method === "pbt") {
      return "population-based training, population=" + a.population + " iterations=" + a.iterations +
        " interval=" + a.interval + " quantile=" + a.quantile;
    }
    return (a.method === "asha" ? "ASHA n=" + a.n + " r=" + a.r + " R=" + a.R : a.R !== undefined ?
      "Hyperband R=" + a.R : "successive halving n=" + a.n) + " eta=" + a.eta +
      (a.budget !== undefined && a.budget !== null ? " budget=" + a.budget + " iterations" : "");
  }

  // Where the search decides: inside the shard slots (ASHA drawing at random: a free slot takes the next
  // decision, recorded as a numbered block of <run>/blocks/ like the others), or between blocks, each
  // training to the next decision point (a rung end, PBT's boundary, a model-based ASHA's job end).
  function decidedText(a) {
    if (a.decided !== "blocks") return "";
    if (a.in_slots) return ", decided between blocks inside the shard slots (a free slot takes the next decision)";
    if (a.method === "asha") return ", decided between blocks, each ending where one of its jobs ends";
    if (a.method === "pbt") return ", decided between blocks, one per interval of " + a.interval + " iteration(s)";
    return ", decided between blocks, one to each rung end";
  }

  function renderPlan(data, configs) {
    var plan = data.plan;
    var holder = clear(document.getElementById("plan"));
    document.getElementById("plan-note").textContent = plan.configurations + " configurations (" + plan.method +
      (plan.adaptive ? ", " + adaptiveText(plan.adaptive) + decidedText(plan.adaptive) : "") + ") \u00b7 " +
      plan.shards + " shard(s) \u00d7 " +
      plan.slots_per_shard + " slot(s) \u00b7 " + plan.iterations + " iteration(s) of " + plan.epochs_per_hop +
      " pass(es) per hop \u00b7 " + plan.model_hops_total + " model hops \u00b7 seed " + plan.seed + " \u00b7 " +
      (plan.recorded ? "as recorded in plan.json." : "provisional: the plan task writes the plan once the data is sharded (before the data is listed, the shards' rows are assumed, and the offset classes may still change).");
    if (plan.brackets.length) {
      holder.appendChild(el("table", {id: "brackets"},
        el("thead", {}, el("tr", {}, ["Bracket", "Rung", "Configurations", "Iterations", "Hops each", "Keep", "Decision"]
          .map(function (h) { return el("th", {text: h}); }))),
        el("tbody", {}, plan.brackets.map(function (b) {
          return b.rungs.map(function (g) {
            var decision = g.decided ? "promoted " + (g.promoted.join(", ") || "none") + "; pruned " + g.pruned.length
              : (g.keep ? "not decided yet" : "last rung");
            return el("tr", {"data-bracket": b.s, "data-rung": g.i}, el("td", {"class": "num", text: b.s}),
              el("td", {"class": "num", text: g.i}), el("td", {"class": "num", text: g.n_i}),
              el("td", {"class": "num", text: g.r_i}), el("td", {"class": "num", text: g.hops_i}),
              el("td", {"class": "num", text: g.keep}), el("td", {text: decision}));
          });
        }))));
    }
    if ((plan.blocks || []).length) {  // a search decided between blocks: every decision, in the order taken
      holder.appendChild(el("table", {id: "decisions"},
        el("thead", {}, el("tr", {}, ["Block", "Decision", "Configuration", "To rung", "Iterations", "On", "Rank"]
          .map(function (h) { return el("th", {text: h}); }))),
        el("tbody", {}, plan.blocks.map(function (b) {
          return b.jobs.map(function (j) {
            return el("tr", {"data-block": b.block, "data-config-id": j.config_id, "data-kind": j.kind},
              el("td", {"class": "num", text: b.block + 1}), el("td", {text: j.kind}),
              el("td", {"class": "config"}, swatch(j.config_id), j.config_id),
              el("td", {"class": "num", text: (j.bracket === null || j.bracket === undefined ? "" : "bracket " + j.bracket +
                " \u00b7 ") + j.rung}), el("td", {"class": "num", text: j.iterations}),
              el("td", {"class": "num", text: j.metric === null || j.metric === undefined ? "" : num(j.metric, 4)}),
              el("td", {"class": "num", text: j.rank ? j.rank + " of " + j.of : ""}));
          });
        }))));
    }
    var head = ["Configuration", "Hyperparameters", plan.brackets.length ? "Bracket" : "Starts on shard"];
    if (!plan.brackets.length) head.push("Visit order (shard per hop, | between iterations)");
    holder.appendChild(el("table", {id: "plan-configs"},
      el("thead", {}, el("tr", {}, head.map(function (h) { return el("th", {text: h}); }))),
      el("tbody", {}, data.configs.map(function (config) {
        var cells = [el("td", {"class": "config"}, swatch(config.config_id), config.config_id),
          el("td", {text: hparamText(config)}),
          el("td", {"class": "num", text: plan.brackets.length ? config.bracket : config.offset_class})];
        if (!plan.brackets.length) {
          var order = plan.visit_order[config.config_id] || [];
          var iterations = [];
          for (var i = 0; i < order.length; i += plan.shards) iterations.push(order.slice(i, i + plan.shards).join(" \u2192 "));
          cells.push(el("td", {"class": "order", text: iterations.join(" | ")}));
        }
        return el("tr", {"data-config-id": config.config_id}, cells);
      }))));
  }

  var DOWNLOAD_LABELS = {"best_model.keras": "Best model (Keras)", "metrics.parquet": "Metrics table (Parquet)",
    "metrics.json": "Metrics table (JSON)", "leaderboard.json": "Leaderboard (JSON)", "summary.json": "Summary (JSON)",
    "hop_timeline.json": "Hop timeline (JSON)", "learning_curves.png": "Learning curves (PNG)",
    "hop_timeline.png": "Hop timeline (PNG)"};

  function renderDownloads(data) {
    var list = clear(document.getElementById("downloads"));
    if (!data.downloads.length) {
      list.appendChild(el("li", {"class": "note", text: "The best model and the metrics table appear here once the report task has written them."}));
      return;
    }
    data.downloads.forEach(function (file) {
      var href = "../../api/runs/" + enc(context.dag_id) + "/" + enc(context.run_id) + "/files/" + enc(file.name) +
        groupQuery(data.group);
      var link = el("a", {href: href, download: file.name, "data-file": file.name, text: DOWNLOAD_LABELS[file.name] || file.name});
      link.addEventListener("click", downloadFromTop);
      list.appendChild(el("li", {}, link, " ", el("span", {"class": "note", text: file.name})));
    });
  }

  // The Airflow UI shows this page in a sandboxed iframe that may not start downloads; the page is
  // of the UI's own origin, so the download is started from the top document instead.
  function downloadFromTop(event) {
    var top;
    try { top = window.top !== window ? window.top.document : null; } catch (e) { top = null; }
    if (!top) return;
    event.preventDefault();
    var link = top.createElement("a");
    link.href = event.currentTarget.href;
    link.download = event.currentTarget.getAttribute("download");
    link.style.display = "none";
    top.body.appendChild(link);
    link.click();
    top.body.removeChild(link);
  }

  if (document.body.dataset.page === "runs") loadRuns(); else refresh();
})();
