;;; magent-store-search.el --- Find past magent sessions by what was said  -*- lexical-binding: t; -*-

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

;; M-x magent-store-search asks for words and lists the sessions in which
;; they were said, best first: title, scope, when, and an excerpt with the
;; match highlighted.  RET opens a session (in magent when
;; `magent-store-mode' is on and magent's runtime is loaded, else as a
;; read-only transcript), n and p move, g searches again.  Nothing here
;; knows magent: the mode puts magent's loader on
;; `magent-store-search-resume-functions'.
;;
;; Each search is a separate `magent-store search --json' process: Emacs
;; starts it and returns at once, and the results are drawn when it exits.
;; That is the cheapest way to keep typing free of the backend: the
;; process brings the index up to date and queries it on its own time, its
;; bulk output never crosses the EPC connection (which serves flushes), and
;; it works whether or not the backend is running.

;;; Change Log:

;; 0.1.0: first release.

;;; Code:

(require 'cl-lib)
(require 'subr-x)
(require 'tabulated-list)
(require 'magent-store)
;; Past sessions are magent's: its session directory is the default root,
;; and RET resumes through magent, even before `magent-store-mode' is on.
(require 'magent-store-magent)

(defgroup magent-store-search nil
  "Search past magent sessions by what was said in them."
  :group 'magent-store
  :prefix "magent-store-search-")

(defcustom magent-store-search-limit 50
  "Most sessions a search lists."
  :type 'natnum
  :group 'magent-store-search)

(defcustom magent-store-search-include-tools nil
  "Non-nil means searches also look in tool input and output.
By default only what the user and the assistant wrote is searched."
  :type 'boolean
  :group 'magent-store-search)

(defcustom magent-store-search-open-function #'magent-store-search-open-default
  "Function called with a hit (an alist from the search) to open its session.
The default offers it to `magent-store-search-resume-functions' (magent,
when `magent-store-mode' is on), else shows a read-only transcript."
  :type 'function
  :group 'magent-store-search)

(defcustom magent-store-search-resume-functions nil
  "Functions that resume a found session in an agent, tried in order.
Each is called with the session's header file and the hit (an alist
from the search); the first that returns non-nil has opened it.  When
none does, RET shows a read-only transcript.  `magent-store-mode' adds
magent's own loader here while it is on."
  :type 'hook
  :group 'magent-store-search)

(defface magent-store-search-match '((t :inherit match))
  "Face of the searched words inside excerpts."
  :group 'magent-store-search)

(defvar magent-store-search-history nil
  "Queries given to `magent-store-search'.")

(defvar-local magent-store-search--query nil
  "The query this buffer shows.")

(defvar-local magent-store-search--root nil
  "The session root this buffer searched.")

(defvar-local magent-store-search--process nil
  "The search process whose results this buffer waits for, or nil.")

(defvar-local magent-store-search--status nil
  "What the header line says besides the query: searching, counts, errors.")

;;;; Running a search

(defun magent-store-search--command (&rest args)
  "Return the backend command line followed by ARGS."
  (append (butlast (magent-store-program-command)) args))

(defun magent-store-search--stop ()
  "Stop the search this buffer waits for, without drawing or saying anything."
  (magent-store-program-stop (prog1 magent-store-search--process
                               (setq magent-store-search--process nil))))

(defun magent-store-search--start ()
  "Start this buffer's search process; draw the results when it exits."
  (magent-store-search--stop)
  (let* ((results (current-buffer))
         (process
          (magent-store-program-run
           "magent-store-search"
           ;; Notices and errors share the output: the JSON is its own line.
           `("search" ,magent-store-search--query ,magent-store-search--root
             "--json" "--limit" ,(number-to-string magent-store-search-limit)
             ,@(and magent-store-search-include-tools '("--role" "tool")))
           (lambda (process text status)
             (when (buffer-live-p results)
               (with-current-buffer results
                 ;; Only the buffer's latest search is drawn.
                 (when (eq process magent-store-search--process)
                   (setq magent-store-search--process nil)
                   (magent-store-search--draw text status))))))))
    (setq magent-store-search--process process
          magent-store-search--status "searching…")
    (setq tabulated-list-entries nil)
    (tabulated-list-print)
    (magent-store-search--header)
    process))

(defun magent-store-search--parse (text)
  "Return the JSON reply in TEXT (the search's output) as an alist, or nil."
  (when (string-match "^{\"query\".*$" text)
    (json-parse-string (match-string 0 text)
                       :object-type 'alist :array-type 'list
                       :null-object nil :false-object nil)))

(defun magent-store-search--draw (text status)
  "Show the hits of the search output TEXT, which exited with STATUS."
  (let* ((reply (and (memq status '(0 1)) (magent-store-search--parse text)))
         (hits (alist-get 'hits reply)))
    (setq magent-store-search--status
          (cond
           (reply (format "%d session%s%s" (length hits) (if (= (length hits) 1) "" "s")
                          (if-let* ((notices (alist-get 'notices reply)))
                              (concat "; " (string-join notices "; "))
                            "")))
           (t (string-trim
               (replace-regexp-in-string "^magent-store: \\(error: \\)?" ""
                                         (if (string-blank-p text)
                                             (format "search failed (exit status %s)" status)
                                           text))))))
    (setq tabulated-list-entries
          (mapcar (lambda (hit) (list hit (magent-store-search--row hit))) hits))
    (tabulated-list-print)
    (goto-char (point-min))
    (magent-store-search--header)
    (unless reply
      (message "magent-store-search: %s" magent-store-search--status))))

(defun magent-store-search--header ()
  "Show the query and the search's status in the mode line."
  (setq mode-line-process
        (format " %S: %s" magent-store-search--query (or magent-store-search--status "")))
  (force-mode-line-update))

;;;; The list

(defun magent-store-search--highlight (excerpt)
  "Return EXCERPT's text, its matches in face `magent-store-search-match'."
  (let ((text (copy-sequence (or (alist-get 'text excerpt) ""))))
    (dolist (span (alist-get 'highlights excerpt))
      (let ((start (nth 0 span)) (end (nth 1 span)))
        (when (and (integerp start) (integerp end) (<= 0 start end (length text)))
          (add-face-text-property start end 'magent-store-search-match nil text))))
    text))

(defun magent-store-search--when (time)
  "Return TIME (seconds since the epoch, or nil) as a short date."
  (if (numberp time) (format-time-string "%Y-%m-%d %H:%M" time) "-"))

(defun magent-store-search--row (hit)
  "Return the columns of HIT."
  (vector (or (alist-get 'title hit) (alist-get 'id hit))
          (concat (or (alist-get 'scope-label hit) "")
                  ;; magent's own format, read as it is.
                  (if (eql (alist-get 'schema hit) 6) " (schema 6)" ""))
          (magent-store-search--when (alist-get 'time hit))
          (magent-store-search--highlight (car (alist-get 'excerpts hit)))))

(defvar magent-store-search-mode-map
  (let ((map (make-sparse-keymap)))
    (define-key map (kbd "RET") #'magent-store-search-open)
    (define-key map "n" #'next-line)
    (define-key map "p" #'previous-line)
    map)
  "Keys of `magent-store-search-mode'.")

(define-derived-mode magent-store-search-mode tabulated-list-mode "Session search"
  "Sessions found by `magent-store-search', best first.
\\<magent-store-search-mode-map>\\[magent-store-search-open] opens the session at point, \
\\[next-line] and \\[previous-line] move, \\[revert-buffer] searches again."
  (setq tabulated-list-format [("Title" 40 t) ("Scope" 24 t) ("When" 16 t) ("Excerpt" 0 nil)])
  (setq tabulated-list-padding 1)
  (setq revert-buffer-function #'magent-store-search--revert)
  (tabulated-list-init-header))

(defun magent-store-search--revert (&rest _)
  "Run this buffer's search again."
  (magent-store-search--start))

;;;###autoload
(defun magent-store-search (query &optional root)
  "List the sessions in which QUERY was said, best first.
Every word of QUERY must appear (in any order, any case, even inside
longer words); \"quoted words\" must appear together.  ROOT is the
session root (default: the one magent-store uses).  Returns the
results buffer at once; the results appear when the search is done."
  (interactive
   (list (read-string "Search sessions for: " nil 'magent-store-search-history)))
  (when (string-blank-p (or query ""))
    (user-error "Give a word or phrase to search for"))
  (let ((root (expand-file-name (or root (magent-store-session-root)))))
    (unless (file-directory-p root)
      (user-error "No session root at %s" root))
    (let ((buffer (get-buffer-create "*magent-store search*")))
      (with-current-buffer buffer
        ;; The mode resets the buffer's variables: stop its search first.
        (magent-store-search--stop)
        (magent-store-search-mode)
        (setq magent-store-search--query query
              magent-store-search--root root)
        (magent-store-search--start))
      (when (called-interactively-p 'any)
        (pop-to-buffer buffer))
      buffer)))

(defun magent-store-search-open ()
  "Open the session at point."
  (interactive)
  (let ((hit (tabulated-list-get-id)))
    (unless hit
      (user-error "No session on this line"))
    (funcall magent-store-search-open-function hit)))

;;;; Opening a session

(defun magent-store-search-open-default (hit)
  "Resume HIT's session in an agent that can, else view it read-only.
The agents are `magent-store-search-resume-functions'."
  (or (run-hook-with-args-until-success 'magent-store-search-resume-functions
                                        (alist-get 'header hit) hit)
      (magent-store-search-view hit)))

(defun magent-store-search-view (hit)
  "Show HIT's session as a read-only transcript (read by a separate process)."
  (let* ((buffer (get-buffer-create (format "*magent-store session %s*" (alist-get 'id hit))))
         (output (generate-new-buffer " *magent-store-show-output*")))
    (with-current-buffer buffer
      (let ((inhibit-read-only t))
        (erase-buffer)
        (special-mode)
        (insert "Reading…\n")))
    (make-process
     :name "magent-store-show"
     :buffer output
     :command (magent-store-search--command "show" (alist-get 'header hit))
     :connection-type 'pipe
     :noquery t
     :sentinel (lambda (process _event)
                 (unless (process-live-p process)
                   (unwind-protect
                       (when (buffer-live-p buffer)
                         (magent-store-search--fill-view
                          buffer hit (with-current-buffer output (buffer-string))
                          (process-exit-status process)))
                     (kill-buffer output)))))
    (pop-to-buffer buffer)
    buffer))

(defun magent-store-search-header-line (text)
  "Return TEXT as a header line that fits the window showing it.
For `header-line-format' as (:eval (magent-store-search-header-line
TEXT)): evaluated for each window that shows the buffer, at its width
then, so a narrow or split window shows the start of TEXT and an
ellipsis, never a line cut short of a wide window's edge."
  (string-replace "%" "%%"
                  (truncate-string-to-width (concat " " text)
                                            (window-max-chars-per-line)
                                            nil nil "…")))

(defun magent-store-search--text (value)
  "Return VALUE (an item's content, input or output) as text, or nil."
  (cond ((null value) nil)
        ((stringp value) (and (not (string-empty-p value)) value))
        (t (json-serialize value :null-object nil
                           :false-object magent-store-json-false))))

(defun magent-store-search--fill-view (buffer hit text status)
  "Fill BUFFER with HIT's transcript from TEXT.
TEXT is the output of `magent-store show', which exited with STATUS."
  (with-current-buffer buffer
    (let ((inhibit-read-only t))
      (erase-buffer)
      (if (not (eq status 0))
          (insert (format "Cannot read session %s:\n%s" (alist-get 'id hit) text))
        ;; The thread is one line of JSON; a notice may share the output.
        (let ((thread (json-parse-string (if (string-match "^{.*$" text)
                                             (match-string 0 text)
                                           text)
                                         :object-type 'alist :array-type 'list
                                         :null-object nil :false-object nil)))
          (insert (propertize (or (alist-get 'title hit) (alist-get 'id hit)) 'face 'bold)
                  (format "\n%s  %s%s\n" (alist-get 'scope-label hit) (alist-get 'id hit)
                          (if (eql (alist-get 'schema hit) 6)
                              "  (magent's own format, schema 6)"
                            "")))
          (dolist (turn (alist-get 'turns thread))
            ;; A prompt no user message holds is the turn's input.
            (when-let* ((prompt (alist-get 'input turn))
                        ((stringp prompt))
                        ((not (string-empty-p prompt)))
                        ((not (cl-find-if (lambda (item)
                                            (and (equal (alist-get 'type item) "message")
                                                 (equal (alist-get 'role item) "user")))
                                          (alist-get 'items turn)))))
              (insert "\n" (propertize "── user ──" 'face 'shadow) "\n" prompt "\n"))
            (dolist (item (alist-get 'items turn))
              (let ((who (or (alist-get 'role item) (alist-get 'name item) (alist-get 'type item))))
                (dolist (field '(content input output))
                  (when-let* ((body (magent-store-search--text (alist-get field item))))
                    (insert "\n" (propertize (format "── %s%s ──" who
                                                     (if (eq field 'content) "" (format " (%s)" field)))
                                             'face 'shadow)
                            "\n" body "\n"))))))))
      (goto-char (point-min))
      (let* ((excerpt (car (alist-get 'excerpts hit)))
             (span (car (alist-get 'highlights excerpt)))
             (case-fold-search t))
        (when (and span (search-forward (substring (alist-get 'text excerpt) (nth 0 span) (nth 1 span))
                                        nil t))
          (goto-char (match-beginning 0)))))))

(provide 'magent-store-search)
;;; magent-store-search.el ends here
