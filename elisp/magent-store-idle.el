;;; magent-store-idle.el --- Compacting sessions idle for days  -*- lexical-binding: t; -*-

;; Copyright (C) 2026 The magent-store authors
;; SPDX-License-Identifier: GPL-3.0-or-later

;; Author: Seed 2a926889 maintainers <maintainers@users.noreply.a-seed-2a926889.example>
;; Maintainer: Seed 2a926889 maintainers <maintainers@users.noreply.a-seed-2a926889.example>
;; Keywords: tools, convenience
;; URL: https://github.com/jamie-cui/magent

;; This file is not part of GNU Emacs.

;; This program is free software: you can redistribute it and/or modify
;; it under the terms of the GNU General Public License as published by
;; the Free Software Foundation, either version 3 of the License, or
;; (at your option) any later version.

;; This program is distributed in the hope that it will be useful,
;; but WITHOUT ANY WARRANTY; without even the implied warranty of
;; MERCHANTABILITY or FITNESS FOR A PARTICULAR PURPOSE.  See the
;; GNU General Public License for more details.

;; You should have received a copy of the GNU General Public License
;; along with this program.  If not, see <https://www.gnu.org/licenses/>.

;;; Commentary:

;; With `magent-store-compact-idle-days' set, the sessions nobody has
;; updated for that many days are compacted into one snapshot each, their
;; log removed, by `magent-store compact --idle-days N ROOT' run as a
;; process of its own: once when `magent-store-mode' turns on, then once
;; a day when Emacs is idle.  Nothing of it runs while magent streams:
;; Emacs only starts the process and reads its output into the buffer
;; ` *magent-store-compact*'; a run that fails says so in one message.

;;; Change Log:

;; 0.1.0: first release.

;;; Code:

(require 'magent-store)
(require 'magent-store-program)

(defvar magent-store-mode)

(defcustom magent-store-compact-idle-days nil
  "Compact the sessions not updated for this many days; nil never does.
When a number, `magent-store-mode' runs \"magent-store compact
--idle-days N\" over the session root as it turns on, then once a
day when Emacs is idle: each such session becomes its header and one
snapshot holding every event, and its log is removed.  Sessions open
in a backend, and damaged ones, are left as they are."
  :type '(choice (const :tag "Never" nil)
                 (number :tag "Days"))
  :group 'magent-store)

(defconst magent-store-idle-buffer " *magent-store-compact*"
  "The buffer that holds the output of the last idle compaction.")

(defvar magent-store-idle-day 86400
  "Seconds between two idle compactions.")

(defvar magent-store-idle-delay 60
  "Seconds of idleness a daily idle compaction waits for.")

(defvar magent-store-idle--timer nil
  "The daily timer, while idle compaction is on.")

(defvar magent-store-idle--process nil
  "The running idle compaction, if any.")

(defun magent-store-idle--days ()
  "`magent-store-compact-idle-days' when it is a number of days above 0, else nil."
  (let ((days magent-store-compact-idle-days))
    (and (numberp days) (> days 0) days)))

(defun magent-store-idle--command (days)
  "Return the command that compacts the sessions idle for DAYS days."
  (append (butlast (magent-store-program-command))
          (list "compact" "--idle-days" (number-to-string days)
                (directory-file-name (magent-store-session-root)))))

;;;###autoload
(defun magent-store-idle-compact ()
  "Compact the sessions idle for `magent-store-compact-idle-days' days, now.
Runs as a process of its own; its output goes to the buffer
`magent-store-idle-buffer'.  Return the process, or nil when the
setting is off, there is no session root yet, or a compaction is
already running."
  (interactive)
  (let ((days (magent-store-idle--days)))
    (cond
     ((not days)
      (when (called-interactively-p 'interactive)
        (user-error "Set `magent-store-compact-idle-days' to a number of days first"))
      nil)
     ((process-live-p magent-store-idle--process) nil)
     ;; No session was ever saved: nothing to compact.
     ((not (file-directory-p (magent-store-session-root))) nil)
     (t
      (condition-case err
          (let ((buffer (get-buffer-create magent-store-idle-buffer)))
            (with-current-buffer buffer
              (erase-buffer))
            (setq magent-store-idle--process
                  (make-process
                   :name "magent-store-compact"
                   :buffer buffer
                   :command (magent-store-idle--command days)
                   :connection-type 'pipe
                   :noquery t
                   :sentinel #'magent-store-idle--sentinel)))
        (error
         (message "magent-store: idle compaction did not start: %s"
                  (error-message-string err))
         nil))))))

(defun magent-store-idle--summary (buffer)
  "The last line of BUFFER, an idle compaction's summary, without its root.
nil when that line is no such summary."
  (when (buffer-live-p buffer)
    (with-current-buffer buffer
      (save-excursion
        (goto-char (point-max))
        (skip-chars-backward "\n")
        (let ((line (buffer-substring (line-beginning-position) (point))))
          (and (string-match ": \\([0-9]+ idle session(s) compacted.*\\)\\'" line)
               (match-string 1 line)))))))

(defun magent-store-idle--sentinel (process _event)
  "Say in one line what PROCESS, an idle compaction, did, or that it failed.
What it compacted, what that saved, what it left and why."
  (unless (process-live-p process)
    (when (eq process magent-store-idle--process)
      (setq magent-store-idle--process nil))
    (let ((status (process-exit-status process))
          (summary (magent-store-idle--summary (process-buffer process))))
      ;; Exit 1: sessions left damaged or not compacted, which the summary names.
      (if (and (eq (process-status process) 'exit) (memq status '(0 1)) summary)
          (message "magent-store: idle compaction: %s" summary)
        (message "magent-store: idle compaction failed (exit %s); see buffer %s"
                 status magent-store-idle-buffer)))))

(defun magent-store-idle--daily ()
  "Compact the idle sessions the next time Emacs is idle."
  (run-with-idle-timer magent-store-idle-delay nil #'magent-store-idle-compact))

(defun magent-store-idle-start ()
  "Compact the idle sessions now, then once a day; nothing when the setting is off.
A setting that is no number of days above 0 is off, and said so."
  (magent-store-idle-stop)
  (cond
   ((magent-store-idle--days)
    (magent-store-idle-compact)
    (setq magent-store-idle--timer
          (run-at-time magent-store-idle-day magent-store-idle-day
                       #'magent-store-idle--daily)))
   (magent-store-compact-idle-days
    (message "magent-store: idle compaction is off: %s is %S, not a number of days above 0"
             'magent-store-compact-idle-days magent-store-compact-idle-days))))

(defun magent-store-idle-stop ()
  "Stop compacting idle sessions once a day (a run under way finishes)."
  (when magent-store-idle--timer
    (cancel-timer magent-store-idle--timer)
    (setq magent-store-idle--timer nil)))

(defun magent-store-idle--mode-changed ()
  "Start or stop the idle compaction with `magent-store-mode'."
  (if magent-store-mode (magent-store-idle-start) (magent-store-idle-stop)))

(add-hook 'magent-store-mode-hook #'magent-store-idle--mode-changed)

(provide 'magent-store-idle)
;;; magent-store-idle.el ends here
